//! What an shm connection costs in file descriptors: its socket, and nothing per tier.
//! A region's memory file is made when the region is first shared with the peer and
//! closed once passed, so neither idle nor promoted connections hold one; a service's
//! connection count is bounded by its limit of open files one for one.
//!
//! Nor does a connection keep anything of a thread that slept on it once that thread
//! has exited.
//!
//! One test in its own binary: it counts the whole process's descriptors.

use tierbuf_transport::connection::Connection;
use tierbuf_transport::{ShmEndpoint, Transport};

/// This process's open file descriptors.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Waits 20 ms for a message that never comes: long enough that the calling thread
/// sleeps in the wait, not only spins.
fn sleep_on(connection: &mut Connection<ShmEndpoint>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(20);
    assert!(
        connection
            .recv_deadline(deadline)
            .expect("a quiet wait")
            .is_none()
    );
}

#[test]
fn an_shm_connection_holds_one_descriptor_a_side_idle_or_promoted() {
    const CONNECTIONS: usize = 64;
    const PROMOTED: usize = 8;
    let path =
        std::env::temp_dir().join(format!("tierbuf-descriptors-{}.sock", std::process::id()));
    let node = Transport::shm()
        .ladder_preset("rpc")
        .budget_bytes(1 << 30)
        .build()
        .expect("a transport");
    let listener = node.listen(&path).expect("a listener");
    // A thread's first sleep in a blocking call makes its doorbell, an `eventfd` it keeps
    // for life; whether this thread sleeps below depends on timing, so it sleeps once
    // here, on a pair that is then closed, before anything is counted.
    let mut warm_up = node.connect(&path).expect("a warm-up connection");
    let warm_up_server = listener.accept().expect("the warm-up connection accepted");
    sleep_on(&mut warm_up);
    drop((warm_up, warm_up_server));
    let before = open_files();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(node.connect(&path).expect("a connection"));
        servers.push(listener.accept().expect("an accepted connection"));
    }
    assert_eq!(
        open_files(),
        before + 2 * CONNECTIONS,
        "one socket a side: the receive regions' memory files were closed once passed"
    );

    // Promote a few connections both ways with messages past the first tier.
    let message: Vec<u8> = (0..9000).map(|at| at as u8).collect();
    let echoed = message.clone();
    let mut promoted: Vec<_> = servers.drain(..PROMOTED).collect();
    let server = std::thread::spawn(move || {
        for connection in &mut promoted {
            let request = connection.recv().expect("a request");
            assert_eq!(&request[..], &echoed[..]);
            drop(request);
            connection.send(&echoed).expect("an echo");
            connection.flush().expect("the echo sent");
        }
        promoted
    });
    for client in clients.iter_mut().take(PROMOTED) {
        client.send(&message).expect("a request");
        assert_eq!(&client.recv().expect("an echo")[..], &message[..]);
        // The peer's ack was held behind the echo; it is taken at the next progress.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while client.stats().send_tier == 0 {
            assert!(std::time::Instant::now() < give_up, "never promoted");
            client.progress().expect("progress");
        }
    }
    let promoted = server.join().expect("the server");
    assert!(promoted.iter().all(|server| server.stats().recv_tier > 0));
    assert_eq!(
        open_files(),
        before + 2 * CONNECTIONS,
        "promoted connections hold no more than idle ones"
    );

    // A thread that slept waiting on a connection and has exited leaves nothing behind:
    // its doorbell went with it, although the connection lives on.
    let mut waited_on = clients.pop().expect("a connection");
    let waited_on = std::thread::spawn(move || {
        sleep_on(&mut waited_on);
        waited_on
    })
    .join()
    .expect("the waiting thread");
    assert_eq!(
        open_files(),
        before + 2 * CONNECTIONS,
        "the connection keeps no descriptor of a thread that waited on it"
    );
    drop(waited_on);
}
