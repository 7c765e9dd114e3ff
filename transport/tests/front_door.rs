//! The front door ([`Transport`]): connections built, listened for, accepted and connected
//! over loopback and shm, many at once with several messages in flight on each, every byte
//! checked; the errors of bad input and of waits that run out, each its own variant.
//!
//! One shm test runs its server in a child process: this test binary started again with
//! `FRONT_DOOR_SOCKET` set, running only `shm_echo_peer_in_a_child_process` (which does
//! nothing without it).

mod errors;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tierbuf_tiers::ladder::{LoadError, TierLadder};
use tierbuf_transport::connection::{Connection, ConnectionError, SendError};
use tierbuf_transport::{Endpoint, Kind, PeerMappingLimit, SetupError, Transport};

/// Connections in the many-connection tests.
const CONNECTIONS: usize = 64;
/// Messages each client sends; up to all of them in flight at once.
const MESSAGES: usize = 6;

/// The `index`th message of connection `connection`: sizes from empty past the `rpc`
/// ladder's top tier (64 KiB, so segmented), bytes that say where they belong.
fn message(connection: usize, index: usize) -> Vec<u8> {
    const SIZES: [usize; 6] = [0, 64, 3000, 9000, 70_000, 200_000];
    let len = SIZES[(connection + index) % SIZES.len()];
    (0..len)
        .map(|at| (at as u8) ^ (connection as u8).wrapping_mul(31) ^ (index as u8))
        .collect()
}

/// Whether a receive failed because the peer closed.
fn peer_closed(error: &ConnectionError) -> bool {
    matches!(error, ConnectionError::PeerClosed)
}

/// Sends every message on every connection, keeping all of a connection's messages in
/// flight, and checks each echo byte for byte, in order. Never blocks on one connection,
/// so the peer's sends on another are never held up by it.
fn run_clients<E: Endpoint>(connections: &mut [Connection<E>]) {
    let mut to_send: Vec<VecDeque<Vec<u8>>> = (0..connections.len())
        .map(|c| (0..MESSAGES).map(|i| message(c, i)).collect())
        .collect();
    let mut expected: Vec<VecDeque<Vec<u8>>> = vec![VecDeque::new(); connections.len()];
    let mut received = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while received < connections.len() * MESSAGES {
        assert!(
            Instant::now() < deadline,
            "{received} echoes came back in time"
        );
        for (index, connection) in connections.iter_mut().enumerate() {
            while let Some(next) = to_send[index].front() {
                match connection.try_send(next) {
                    Ok(_) => expected[index].push_back(to_send[index].pop_front().unwrap()),
                    Err(SendError::WouldBlock(_)) => break,
                    Err(error) => panic!("connection {index}: {error}"),
                }
            }
            while let Some(echo) = connection.try_recv().expect("a client's receive") {
                let want = expected[index]
                    .pop_front()
                    .expect("an echo of a message sent");
                assert!(echo[..] == want[..], "connection {index}: an echo differs");
                received += 1;
            }
        }
    }
}

/// Echoes every message on every connection until each client hangs up.
fn echo<E: Endpoint>(mut connections: Vec<Connection<E>>) {
    let mut replies: Vec<VecDeque<Vec<u8>>> = vec![VecDeque::new(); connections.len()];
    let mut open = vec![true; connections.len()];
    while open.iter().any(|&open| open) {
        for (index, connection) in connections.iter_mut().enumerate() {
            if !open[index] {
                continue;
            }
            loop {
                match connection.try_recv() {
                    Ok(Some(request)) => replies[index].push_back(request.to_vec()),
                    Ok(None) => break,
                    Err(error) if peer_closed(&error) => {
                        open[index] = false;
                        break;
                    }
                    Err(error) => panic!("server {index}: {error}"),
                }
            }
            while let Some(reply) = replies[index].front() {
                match connection.try_send(reply) {
                    Ok(_) => drop(replies[index].pop_front()),
                    Err(SendError::WouldBlock(_)) => break,
                    Err(error) if !open[index] => drop(error),
                    Err(error) => panic!("server {index}: {error}"),
                }
            }
        }
    }
}

/// A transport of kind `K` on the `rpc` ladder with room for the tests' connections.
fn build<K: Kind>(builder: tierbuf_transport::TransportBuilder<K>) -> Transport<K> {
    builder
        .ladder_preset("rpc")
        .budget_bytes(1 << 30)
        .build()
        .expect("a transport")
}

/// What the budget charges the reservoir's spares: each region its whole pages (a region
/// is a whole number of slots, each with its headroom, so not always of pages).
fn spares_charged<K: Kind>(node: &Transport<K>) -> u64 {
    let page = tierbuf_pool::page_size() as u64;
    let reservoir = node.reservoir();
    reservoir
        .ladder()
        .iter()
        .map(|(tier, spec)| {
            reservoir.spare(tier) as u64 * (spec.region_len() as u64).next_multiple_of(page)
        })
        .sum()
}

/// A socket path of this test's own.
fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tierbuf-front-{}-{name}.sock", std::process::id()))
}

#[test]
fn many_loopback_connections_carry_every_byte_with_messages_in_flight() {
    let node = build(Transport::loopback());
    let listener = node.listen("echo").unwrap();
    let mut clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| node.connect("echo").unwrap())
        .collect();
    let servers: Vec<_> = (0..CONNECTIONS)
        .map(|_| listener.accept().unwrap())
        .collect();
    let server = std::thread::spawn(move || echo(servers));
    run_clients(&mut clients);
    drop(clients);
    server.join().unwrap();
    drop(listener);
    // Every registered byte is back but the reservoir's spares.
    assert_eq!(node.budget().in_use(), spares_charged(&node));
}

#[test]
fn many_shm_connections_between_two_threads_carry_every_byte() {
    let path = socket_path("many");
    let node = build(Transport::shm());
    let listener = node.listen(&path).unwrap();
    let server = std::thread::spawn(move || {
        let connections: Vec<_> = (0..CONNECTIONS)
            .map(|_| listener.accept().unwrap())
            .collect();
        echo(connections);
    });
    let mut clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| node.connect(&path).unwrap())
        .collect();
    run_clients(&mut clients);
    drop(clients);
    server.join().unwrap();
    assert!(!path.exists(), "the listener removed its socket");
    assert_eq!(node.budget().in_use(), spares_charged(&node));
}

/// The shm builder's mapping total is the transport's: with room for one of its peers'
/// regions, the second of the two endpoints of one connection (both in this process) to
/// map its peer's receive region fails, as this process's resource, not the peer's fault.
/// The messages are longer than travels inline, so each is copied into the peer's region.
#[test]
fn an_shm_transport_maps_no_more_of_its_peers_than_its_total() {
    let path = socket_path("total");
    let node = Transport::shm()
        .ladder_preset("rpc")
        .budget_bytes(1 << 30)
        .peer_mapping_total(PeerMappingLimit::new(1, 1 << 30))
        .build()
        .expect("a transport");
    let listener = node.listen(&path).unwrap();
    let mut client = node.connect(&path).unwrap();
    let mut server = listener.accept().unwrap();
    let (ping, pong) = ([1u8; 1000], [2u8; 1000]);
    let mut round_trip = || -> Result<(), Box<dyn std::error::Error>> {
        client.send(&ping)?;
        assert_eq!(server.recv()?[..], ping);
        server.send(&pong)?;
        assert_eq!(client.recv()?[..], pong);
        Ok(())
    };
    let error = round_trip().expect_err("the second mapping is past the total");
    let text = errors::chain(&*error);
    assert!(text.contains("with_peer_mapping_total"), "{text}");
    assert!(text.contains("not the peer's fault"), "{text}");
}

#[test]
fn a_connection_is_used_from_another_thread() {
    let node = build(Transport::loopback());
    let listener = node.listen("elsewhere").unwrap();
    let client = node.connect("elsewhere").unwrap();
    let mut server = listener.accept().unwrap();
    let sender = std::thread::spawn(move || {
        let mut client = client;
        client.send(&message(1, 4)).unwrap();
        client.flush().unwrap();
        client
    });
    assert_eq!(&server.recv().unwrap()[..], &message(1, 4)[..]);
    drop(sender.join().unwrap());
}

/// Environment variable naming the socket the child process listens at.
const CHILD_SOCKET: &str = "FRONT_DOOR_SOCKET";

#[test]
fn shm_echo_peer_in_a_child_process() {
    // Only as the child process of `an_shm_peer_in_another_process_echoes_every_byte`.
    let Some(path) = std::env::var_os(CHILD_SOCKET) else {
        return;
    };
    let node = build(Transport::shm());
    let listener = node.listen(PathBuf::from(path)).unwrap();
    let connections: Vec<_> = (0..4).map(|_| listener.accept().unwrap()).collect();
    echo(connections);
}

#[test]
fn an_shm_peer_in_another_process_echoes_every_byte() {
    let path = socket_path("child");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shm_echo_peer_in_a_child_process", "--nocapture"])
        .env(CHILD_SOCKET, &path)
        .spawn()
        .unwrap();
    let node = build(Transport::shm());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < deadline, "the child listens in time");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut clients: Vec<_> = (0..4)
        .map(|_| {
            node.connect_timeout(&path, Duration::from_secs(10))
                .unwrap()
        })
        .collect();
    run_clients(&mut clients);
    drop(clients);
    assert!(
        child.wait().unwrap().success(),
        "the child echoed and exited"
    );
}

#[test]
fn an_unknown_preset_is_named() {
    let error = Transport::loopback()
        .ladder_preset("huge")
        .budget_bytes(1 << 20)
        .build()
        .unwrap_err();
    assert!(
        matches!(&error, SetupError::UnknownPreset { name, source: LoadError::UnknownPreset { .. } } if name == "huge"),
        "{error:?}"
    );
}

#[test]
fn an_unreadable_ladder_file_is_named() {
    let path = Path::new("/nonexistent/ladder.toml");
    let error = Transport::shm()
        .ladder_file(path)
        .budget_bytes(1 << 20)
        .build()
        .unwrap_err();
    assert!(
        matches!(&error, SetupError::LadderFile { path: named, source: LoadError::Read { .. } } if named == path),
        "{error:?}"
    );
}

#[test]
fn a_budget_smaller_than_the_ladder_needs_is_refused_before_anything_registers() {
    let error = Transport::loopback()
        .ladder_preset("storage")
        .budget_bytes(64 << 10)
        .build()
        .unwrap_err();
    assert!(
        matches!(error, SetupError::BudgetTooSmall { cap, needed } if cap == 64 << 10 && needed > cap),
        "{error:?}"
    );
}

#[test]
fn a_ladder_deeper_than_the_shm_ring_is_refused() {
    let ladder = TierLadder::builder()
        .tier(512, 600, 512)
        .tier(8 << 10, 600, 8 << 10)
        .build()
        .unwrap();
    let error = Transport::shm()
        .ladder(ladder)
        .budget_bytes(1 << 30)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            error,
            SetupError::QueueTooDeep {
                needed: 1200,
                max: 1024,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn an_invalid_override_is_a_ladder_error() {
    let error = Transport::loopback()
        .demote_after(Duration::ZERO)
        .budget_bytes(1 << 30)
        .build()
        .unwrap_err();
    assert!(matches!(error, SetupError::Ladder { .. }), "{error:?}");
}

#[test]
fn connecting_to_a_name_or_path_nobody_listens_at_is_no_listener() {
    let loopback = build(Transport::loopback());
    let error = loopback.connect("nobody").unwrap_err();
    assert!(
        matches!(&error, SetupError::NoListener { address, .. } if address == "nobody"),
        "{error:?}"
    );
    // A name is free again once its listener is dropped.
    drop(loopback.listen("gone").unwrap());
    let error = loopback.connect("gone").unwrap_err();
    assert!(matches!(error, SetupError::NoListener { .. }), "{error:?}");

    let shm = build(Transport::shm());
    let error = shm.connect(socket_path("nobody")).unwrap_err();
    assert!(
        matches!(
            error,
            SetupError::NoListener {
                source: Some(_),
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_name_listened_at_twice_is_in_use() {
    let node = build(Transport::loopback());
    let _first = node.listen("twice").unwrap();
    let error = node.listen("twice").unwrap_err();
    assert!(
        matches!(error, SetupError::AddressInUse { .. }),
        "{error:?}"
    );
}

#[test]
fn accepting_with_nobody_connecting_times_out() {
    let loopback = build(Transport::loopback());
    let listener = loopback.listen("quiet").unwrap();
    let error = listener
        .accept_timeout(Duration::from_millis(20))
        .unwrap_err();
    assert!(matches!(error, SetupError::TimedOut { .. }), "{error:?}");

    let path = socket_path("quiet");
    let shm = build(Transport::shm());
    let listener = shm.listen(&path).unwrap();
    let started = Instant::now();
    let error = listener
        .accept_timeout(Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(error, SetupError::TimedOut { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The listener still accepts after a timeout, and stops when dropped.
    let _client = shm.connect(&path).unwrap();
    let _server = listener.accept_timeout(Duration::from_secs(10)).unwrap();
    drop(listener);
    assert!(!path.exists());
}

#[test]
fn connecting_to_a_socket_that_never_answers_times_out() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let path = socket_path("mute");
    // A listening socket that takes connections into its backlog and never answers.
    let mute = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&mute, &SocketAddrUnix::new(&path).unwrap()).unwrap();
    rustix::net::listen(&mute, 8).unwrap();
    let node = build(Transport::shm());
    let started = Instant::now();
    let error = node
        .connect_timeout(&path, Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(error, SetupError::TimedOut { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
    drop(mute);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_shm_listeners_thread_stops_when_it_is_dropped() {
    let path = socket_path("stop");
    let node = build(Transport::shm());
    for _ in 0..3 {
        let listener = node.listen(&path).unwrap();
        drop(listener);
        assert!(!path.exists());
    }
    assert_eq!(node.budget().in_use(), spares_charged(&node));
}

#[test]
fn an_shm_socket_path_appears_only_once_it_accepts_connections() {
    // A client that waits for the path to exist and then connects, as a parent waits for
    // the server process it started, is never refused for coming between the listener's
    // `bind` and its `listen`.
    // A directory of its own, so that only this test's names can appear in it.
    let directory = socket_path("appears");
    std::fs::create_dir(&directory).unwrap();
    let path = directory.join("listener.sock");
    let node = build(Transport::shm());
    for _ in 0..1000 {
        std::thread::scope(|scope| {
            let client = scope.spawn(|| {
                while !path.exists() {
                    std::hint::spin_loop();
                }
                node.connect_timeout(&path, Duration::from_secs(10))
            });
            let listener = node.listen(&path).unwrap();
            let _server = listener.accept_timeout(Duration::from_secs(10)).unwrap();
            client
                .join()
                .unwrap()
                .expect("connected once the path exists");
        });
        assert!(!path.exists());
    }
    // A path already taken stays the other socket's, and says so.
    let listener = node.listen(&path).unwrap();
    let error = node.listen(&path).unwrap_err();
    assert!(
        matches!(&error, SetupError::AddressInUse { address } if *address == path.display().to_string()),
        "{error:?}"
    );
    drop(listener);
    std::fs::remove_dir(&directory).expect("no socket or staging name left behind");
}

#[test]
fn an_shm_listener_is_not_stopped_by_staging_names_a_dead_process_left() {
    // A process of this PID that died between its bind and its link left its staging
    // names behind (every name this process's listeners could take next, here).
    let directory = socket_path("stale");
    std::fs::create_dir(&directory).unwrap();
    for count in 0..5_000 {
        std::fs::write(
            directory.join(format!(".tierbuf-{}-{count}", std::process::id())),
            b"",
        )
        .unwrap();
    }
    let node = build(Transport::shm());
    let path = directory.join("listener.sock");
    let listener = node.listen(&path).expect("the stale name is replaced");
    let _client = node
        .connect_timeout(&path, Duration::from_secs(10))
        .unwrap();
    let _server = listener.accept_timeout(Duration::from_secs(10)).unwrap();
    drop(listener);
    std::fs::remove_dir_all(&directory).unwrap();
}
