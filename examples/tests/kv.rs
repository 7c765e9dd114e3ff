//! The key-value service end to end, with small sizes: over shm with the server a real
//! second process, on both ladders; over loopback in one process; malformed requests
//! answered with BAD REQUEST while the server goes on; a killed server process giving the
//! client an error, not a hang.
//!
//! The server process is this test binary started again with `TIERBUF_KV_SOCKET` set,
//! running only `server_process` (which does nothing without it).

use std::io::IoSlice;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tierbuf_examples::kv::client::{KvClient, Workload};
use tierbuf_examples::kv::memory::Sampler;
use tierbuf_examples::kv::process::{ServerProcess, socket_path};
use tierbuf_examples::kv::server::{SAMPLE_PERIOD, run_shm_server, serve_connection};
use tierbuf_examples::kv::store::Store;
use tierbuf_examples::kv::wire::{Reply, Request, Status, VERSION};
use tierbuf_examples::kv::{KvError, LadderChoice, Setup, run};
use tierbuf_transport::Transport;

/// The socket the server process listens at.
const SOCKET: &str = "TIERBUF_KV_SOCKET";
/// The server process's ladder, by name.
const LADDER: &str = "TIERBUF_KV_LADDER";
/// Connections in every run.
const CONNECTIONS: usize = 2;

/// A small workload: 24 keys a connection, two of them past the 1 MiB top tier.
fn workload() -> Workload {
    Workload {
        keys: 24,
        large_every: 12,
        medium_every: 4,
        max_value: 1_300_000,
        delete_every: 3,
        idle: Duration::from_millis(400),
        seed: 7,
        reply_timeout: Duration::from_secs(20),
    }
}

/// The command that runs this binary as the server process of `ladder` at `socket`.
fn server_command(ladder: LadderChoice) -> impl FnOnce(&Path) -> Result<Command, KvError> {
    move |socket| {
        let mut command = Command::new(std::env::current_exe().expect("this test binary"));
        // Quiet: the harness writes no partial line before the server's `listening`.
        command
            .args([
                "server_process",
                "--exact",
                "--quiet",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SOCKET, socket)
            .env(LADDER, ladder.name());
        Ok(command)
    }
}

/// The server process, when this binary is started as one.
#[test]
fn server_process() {
    let Some(socket) = std::env::var_os(SOCKET) else {
        return;
    };
    let ladder = std::env::var(LADDER).expect("the ladder's name");
    let ladder = LadderChoice::from_name(&ladder).expect("a ladder's name");
    run_shm_server(Path::new(&socket), &Setup::new(ladder, CONNECTIONS)).unwrap();
}

#[test]
fn every_byte_comes_back_over_shm_between_two_processes_on_both_ladders() {
    let workload = workload();
    for ladder in LadderChoice::ALL {
        let outcome = run::over_shm(
            &Setup::new(ladder, CONNECTIONS),
            &workload,
            server_command(ladder),
        )
        .unwrap_or_else(|error| panic!("{}: {error:?}", ladder.name()));
        let names: Vec<_> = outcome.phases.iter().map(|phase| phase.name).collect();
        assert_eq!(names, ["put", "get", "delete", "idle"]);
        assert_eq!(outcome.phases[0].ops, (CONNECTIONS * workload.keys) as u64);
        assert_eq!(outcome.phases[1].bytes, outcome.phases[0].bytes);
        assert_eq!(outcome.phases[2].ops, (CONNECTIONS * 8 * 2) as u64);
        assert!(outcome.start() > 0 && outcome.peak() >= outcome.start());
        match ladder {
            LadderChoice::Tiered => {
                assert!(outcome.promotions > 0, "large values promote");
                assert!(outcome.peak() > outcome.start(), "{outcome:?}");
            }
            LadderChoice::Static => assert_eq!(outcome.promotions, 0),
        }
    }
}

#[test]
fn every_byte_comes_back_over_loopback_in_one_process() {
    let outcome =
        run::over_loopback(&Setup::new(LadderChoice::Tiered, CONNECTIONS), &workload()).unwrap();
    assert_eq!(
        outcome.phases[1].ops,
        (CONNECTIONS * workload().keys) as u64
    );
    assert!(outcome.peak() > outcome.start());
}

#[test]
fn malformed_requests_are_answered_with_bad_request_and_the_server_goes_on() {
    let transport = Setup::new(LadderChoice::Tiered, 1)
        .transport(Transport::loopback())
        .unwrap();
    let listener = transport.listen("kv").unwrap();
    let mut client = transport.connect("kv").unwrap();
    let mut server = listener.accept().unwrap();
    let store = Store::create_temporary().unwrap();
    let sampler = Sampler::start(transport.budget().clone(), SAMPLE_PERIOD);
    std::thread::scope(|scope| {
        let served = scope.spawn(|| serve_connection(0, &mut server, &store, &sampler));
        let mut get = Vec::new();
        Request::Get { key: b"key" }.encode(&mut get);
        let mut wrong_version = get.clone();
        wrong_version[0] = VERSION + 1;
        let mut too_long = get.clone();
        too_long.push(0);
        for (request, says) in [
            (&b""[..], "shorter than"),
            (&b"\x01\x02"[..], "shorter than"),
            (&wrong_version[..], "protocol version"),
            (&too_long[..], "declares"),
            (&get[..get.len() - 1], "declares"),
        ] {
            client.send(request).unwrap();
            let reply = client
                .recv_deadline(Instant::now() + Duration::from_secs(10))
                .unwrap()
                .expect("a reply");
            let reply = Reply::decode(&reply).unwrap();
            assert_eq!(reply.status, Status::BadRequest);
            let message = std::str::from_utf8(reply.body).unwrap();
            assert!(message.contains(says), "{message:?}");
        }
        // A value as a request's header and parts, sent as one message in pieces.
        let header = [VERSION, 1, 1, 0, 3, 0, 0, 0];
        client
            .send_gather(&[
                IoSlice::new(&header),
                IoSlice::new(b"k"),
                IoSlice::new(b"abc"),
            ])
            .unwrap();
        let reply = client
            .recv_deadline(Instant::now() + Duration::from_secs(10))
            .unwrap()
            .expect("a reply");
        assert_eq!(Reply::decode(&reply).unwrap().status, Status::Ok);
        let mut client = KvClient::new(0, client, Duration::from_secs(10));
        assert_eq!(&client.get(b"k").unwrap().expect("stored")[..], b"abc");
        assert!(client.delete(b"k").unwrap());
        assert!(client.get(b"k").unwrap().is_none());
        drop(client);
        served.join().unwrap().unwrap();
    });
}

#[test]
fn a_killed_server_process_gives_the_client_an_error_not_a_hang() {
    let setup = Setup::new(LadderChoice::Tiered, CONNECTIONS);
    let transport = setup.transport(Transport::shm()).unwrap();
    let socket = socket_path();
    let mut process = ServerProcess::start(
        server_command(LadderChoice::Tiered)(&socket).unwrap(),
        socket.clone(),
    )
    .unwrap();
    let mut connections: Vec<_> = (0..CONNECTIONS)
        .map(|_| transport.connect(&socket).unwrap())
        .collect();
    let mut client = KvClient::new(0, connections.remove(0), Duration::from_secs(20));
    client.put(b"key", b"value").unwrap();
    process.kill();
    let started = Instant::now();
    let error = client.get(b"key").expect_err("the server is gone");
    assert!(
        matches!(error, KvError::Send { .. } | KvError::Receive { .. }),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(process);
    assert!(
        !socket.exists(),
        "the killed server's socket file is removed"
    );
}
