//! What waiting costs: the CPU time of a thread blocked in `recv` for a second, of a
//! server thread waiting on the readiness of many idle connections for a second, and of
//! a table's progress thread serving many idle connections for a second.
//!
//! ```text
//! cargo run --release -p tierbuf-examples --example idle_cost
//! cargo run --release -p tierbuf-examples --features verbs --example idle_cost -- verbs rxe0 400
//! ```
//!
//! The first measures the loopback and shm providers; the second, in a build with the
//! `verbs` feature, the verbs provider on the RDMA device named, over the number of idle
//! connections given (400 unless given). `.ci/verbs-rxe` runs the second on soft-RoCE.
//!
//! Each figure is the CPU time (user and system, `getrusage`) the waiting thread used
//! over the wait, as a share of the wait's wall time: 2 % is 20 ms of a 1 s wait. It
//! exits non-zero if a wait returned anything but "nothing came".

use std::time::{Duration, Instant};

use tierbuf_transport::connection::{Connection, ConnectionTable, ProgressConfig};
use tierbuf_transport::{Endpoint, Transport};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long each wait lasts.
const WAIT: Duration = Duration::from_secs(1);

/// The CPU time used so far by `who`: `libc::RUSAGE_THREAD` (this thread) or
/// `libc::RUSAGE_SELF` (the whole process, every thread).
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: `getrusage` writes the whole struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        assert_eq!(libc::getrusage(who, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Runs `wait` and returns the share of a core the thread used meanwhile.
fn share_of_a_core(wait: impl FnOnce() -> Result<(), Error>) -> Result<f64, Error> {
    let (cpu, wall) = (cpu_time(libc::RUSAGE_THREAD), Instant::now());
    wait()?;
    Ok((cpu_time(libc::RUSAGE_THREAD) - cpu).as_secs_f64() / wall.elapsed().as_secs_f64())
}

/// A thread blocked in `recv_deadline` on a connection nothing is sent on.
fn blocked_recv<E: Endpoint>(mut connection: Connection<E>) -> Result<f64, Error> {
    share_of_a_core(|| match connection.recv_deadline(Instant::now() + WAIT)? {
        None => Ok(()),
        Some(_) => Err("a message came on a connection nothing was sent on".into()),
    })
}

/// A thread waiting on a table of `connections` idle connections: both ends of
/// `connections / 2` pairs, all in this process.
fn idle_table<E: Endpoint + 'static>(
    mut pair: impl FnMut() -> Result<(Connection<E>, Connection<E>), Error>,
    connections: usize,
) -> Result<f64, Error> {
    let table = ConnectionTable::new();
    for _ in 0..connections / 2 {
        let (client, served) = pair()?;
        table.insert(client);
        table.insert(served);
    }
    let mut ready = Vec::new();
    // The first waits take the fresh connections' own start-up work: until one hands out
    // nothing, and one more of a whole `WAIT` (where the last connections' first looks
    // land, about 1 ms of 10 000 shm connections), so the figure is of a table at rest.
    while table.wait_ready(&mut ready, Duration::from_millis(50))? > 0 {}
    if table.wait_ready(&mut ready, WAIT)? > 0 {
        return Err("an idle connection was handed out".into());
    }
    share_of_a_core(|| match table.wait_ready(&mut ready, WAIT)? {
        0 => Ok(()),
        _ => Err("an idle connection was handed out".into()),
    })
}

/// A table of `connections` idle connections (both ends of `connections / 2` pairs)
/// driven by its progress thread: the process's CPU over a second in which this thread
/// sleeps, so the progress thread's; and the looks at connections it made meanwhile.
fn progress_thread<E: Endpoint + 'static>(
    mut pair: impl FnMut() -> Result<(Connection<E>, Connection<E>), Error>,
    connections: usize,
) -> Result<(f64, u64), Error> {
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default())?;
    for _ in 0..connections / 2 {
        let (client, served) = pair()?;
        table.insert(client);
        table.insert(served);
    }
    // The connections' start-up work first, as for `idle_table`.
    std::thread::sleep(WAIT);
    let looks = || {
        let stats = table.progress_stats();
        stats.progressed + stats.skipped_busy
    };
    let (cpu, wall, looked) = (cpu_time(libc::RUSAGE_SELF), Instant::now(), looks());
    std::thread::sleep(WAIT);
    let share = (cpu_time(libc::RUSAGE_SELF) - cpu).as_secs_f64() / wall.elapsed().as_secs_f64();
    Ok((share, looks() - looked))
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => software_providers(),
        Some("verbs") => {
            let device = args
                .get(1)
                .ok_or("usage: idle_cost verbs DEVICE [CONNECTIONS]")?;
            let connections = match args.get(2) {
                Some(count) => count.parse()?,
                None => 400,
            };
            verbs(device, connections)
        }
        Some(other) => {
            Err(format!("unknown argument {other:?}: give none, or verbs DEVICE [N]").into())
        }
    }
}

/// The figures of the verbs provider on `device`, over `connections` idle connections.
#[cfg(feature = "verbs")]
fn verbs(device: &str, connections: usize) -> Result<(), Error> {
    use tierbuf_transport::verbs::VerbsConfig;
    let verbs = Transport::verbs(VerbsConfig::new(device))
        .ladder_preset("two-tier")
        .budget_bytes(1 << 30)
        // The table's connections, and both ends of the blocked receive's pair.
        .connections(connections + 2)
        .build()?;
    let listener = verbs.listen("127.0.0.1:0")?;
    let addr: std::net::SocketAddr = listener.address().parse()?;
    let pair = || -> Result<_, Error> {
        let client = verbs.connect(addr)?;
        Ok((client, listener.accept()?))
    };
    println!("CPU used while waiting {WAIT:?}, as a share of one core (device {device}):");
    let (_client, mut connection) = pair()?;
    // The connection's start-up work first, as the tables' below: under an emulated CPU
    // (soft-RoCE in CI) it takes a good part of a second.
    if connection.recv_deadline(Instant::now() + WAIT)?.is_some() {
        return Err("a message came on a connection nothing was sent on".into());
    }
    println!(
        "  blocked recv, verbs:                  {:6.3} %",
        100.0 * blocked_recv(connection)?
    );
    println!(
        "  {connections:>6} idle verbs connections:   {:6.3} %",
        100.0 * idle_table(pair, connections)?
    );
    let (share, looks) = progress_thread(pair, connections)?;
    println!(
        "  progress thread, {connections:>6} verbs:       {:6.3} % ({looks} looks)",
        100.0 * share
    );
    Ok(())
}

#[cfg(not(feature = "verbs"))]
fn verbs(_device: &str, _connections: usize) -> Result<(), Error> {
    Err(
        "the verbs figures need a build with the verbs feature: cargo run --release -p \
         tierbuf-examples --features verbs --example idle_cost -- verbs DEVICE"
            .into(),
    )
}

/// The figures of the loopback and shm providers.
fn software_providers() -> Result<(), Error> {
    let loopback = Transport::loopback()
        .ladder_preset("two-tier")
        .budget_bytes(1 << 30)
        .build()?;
    let shm = Transport::shm()
        .ladder_preset("two-tier")
        .budget_bytes(1 << 30)
        // Both ends of 5 000 pairs, and of the blocked receive's.
        .connections(10_002)
        .build()?;
    let loopback_listener = loopback.listen("idle")?;
    let loopback_pair = || -> Result<_, Error> {
        let client = loopback.connect("idle")?;
        Ok((client, loopback_listener.accept()?))
    };
    let path = std::env::temp_dir().join(format!("tierbuf-idle-{}", std::process::id()));
    let shm_listener = shm.listen(&path)?;
    let shm_pair = || -> Result<_, Error> {
        let client = shm.connect(&path)?;
        Ok((client, shm_listener.accept()?))
    };

    println!("CPU used while waiting {WAIT:?}, as a share of one core:");
    let (_client, connection) = loopback_pair()?;
    println!(
        "  blocked recv, loopback:               {:6.3} %",
        100.0 * blocked_recv(connection)?
    );
    let (_client, connection) = shm_pair()?;
    println!(
        "  blocked recv, shm:                    {:6.3} %",
        100.0 * blocked_recv(connection)?
    );
    println!(
        "  10 000 idle loopback connections:     {:6.3} %",
        100.0 * idle_table(loopback_pair, 10_000)?
    );
    println!(
        "  10 000 idle shm connections:          {:6.3} %",
        100.0 * idle_table(shm_pair, 10_000)?
    );
    for connections in [100, 10_000] {
        let (share, looks) = progress_thread(loopback_pair, connections)?;
        println!(
            "  progress thread, {connections:>6} loopback:    {:6.3} % ({looks} looks)",
            100.0 * share
        );
    }
    let (share, looks) = progress_thread(shm_pair, 10_000)?;
    println!(
        "  progress thread,  10000 shm:         {:6.3} % ({looks} looks)",
        100.0 * share
    );
    Ok(())
}
