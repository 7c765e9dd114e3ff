//! What an shm connection costs in file descriptors: its socket, and nothing per tier.
//! A region's memory file is made when the region is first shared with the peer and
//! closed once passed, so neither idle nor promoted connections hold one; a service's
//! connection count is bounded by its limit of open files one for one.
//!
//! One test in its own binary: it counts the whole process's descriptors.

use tierbuf_transport::Transport;

/// This process's open file descriptors.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
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
        assert!(client.stats().send_tier > 0, "promoted past tier 0");
    }
    let promoted = server.join().expect("the server");
    assert!(promoted.iter().all(|server| server.stats().recv_tier > 0));
    assert_eq!(
        open_files(),
        before + 2 * CONNECTIONS,
        "promoted connections hold no more than idle ones"
    );
}
