//! A watched transport's stats follow its connection while nothing arrives: a demotion
//! that a timer brings about is published by the poll the timer wakes, so a service
//! reading its idle connections' stats sees them step back down.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tierbuf_tarpc::TierbufTransport;
use tierbuf_transport::Transport;

#[tokio::test(flavor = "current_thread")]
async fn a_demotion_on_an_idle_connection_is_published() {
    let node = Transport::loopback()
        .ladder_preset("rpc")
        .budget_bytes(16 << 20)
        .demote_after(Duration::from_millis(20))
        .build()
        .expect("a loopback transport");
    let listener = node.listen("idle-stats").expect("listen");
    let connection = node.connect("idle-stats").expect("connect");
    let mut a =
        TierbufTransport::<_, Vec<u8>, Vec<u8>>::from_connection(connection).expect("in tokio");
    let mut b = TierbufTransport::<_, Vec<u8>, Vec<u8>>::from_connection(
        listener.accept().expect("accept"),
    )
    .expect("in tokio");
    let watch = a.watch_stats();
    a.send(vec![7; 4 << 10])
        .await
        .expect("send past the first tier");
    let peer = tokio::spawn(async move {
        // The peer reads until `a` hangs up, answering its control frames.
        let first = b.next().await.expect("a message").expect("received");
        assert_eq!(first.len(), 4 << 10);
        while let Some(received) = b.next().await {
            received.expect("nothing but the close");
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while watch.latest().tiers.demotions == 0 {
        assert!(
            Instant::now() < deadline,
            "no demotion published in 10 s: {:?}",
            watch.latest()
        );
        // Nothing arrives: the poll only runs the connection's timers and control.
        let received = tokio::time::timeout(Duration::from_millis(50), a.next()).await;
        assert!(received.is_err(), "nothing was sent to `a`");
    }
    assert_eq!(watch.latest().tiers.promotions, 1);
    drop(a);
    peer.await.expect("the peer's task");
}
