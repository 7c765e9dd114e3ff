//! What one peer can reach of this process's memory: over shm, the receive regions this
//! side announced to it (their memory files), and nothing that later serves another
//! peer. A region announced to a peer is deregistered when its connection gives it back,
//! never kept in the shared reservoir for the next connection (`docs/transport.md`,
//! "Registration" of the shm provider).

mod pairs;

use pairs::Shared;
use std::sync::Arc;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::{Reservoir, TierIndex};
use tierbuf_transport::connection::{Connection, SendError};
use tierbuf_transport::{Provider, ShmEndpoint, ShmProvider};

/// Spares a shelf keeps: more than a pair of connections takes from one tier.
const SPARES: usize = 4;

fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(256, 8, 240)
            .tier(4096, 8, 4080)
            .reservoir_regions(SPARES)
            .build()
            .unwrap(),
    )
}

/// A connected pair over `provider`, both connections on what `shared` holds.
fn connected_pair(
    provider: &ShmProvider,
    shared: &Shared,
) -> (Connection<ShmEndpoint>, Connection<ShmEndpoint>) {
    let depth = shared.config.queue_depth();
    let (a, b) = provider.pair(depth, depth).unwrap();
    (shared.connection(a), shared.connection(b))
}

/// Sends `len` bytes from `a` to `b` and waits, driving both, until `b` has them and `a`
/// has seen its promotion land.
fn promote_with(a: &mut Connection<ShmEndpoint>, b: &mut Connection<ShmEndpoint>, len: usize) {
    let message = vec![0x5A; len];
    loop {
        match a.try_send(&message) {
            Ok(()) => break,
            Err(SendError::WouldBlock(_)) => {
                a.progress().unwrap();
                b.progress().unwrap();
            }
            Err(error) => panic!("send: {error}"),
        }
    }
    let received = loop {
        a.progress().unwrap();
        if let Some(message) = b.try_recv().unwrap() {
            break message;
        }
    };
    assert_eq!(&received[..], &message[..]);
    drop(received);
    while a.stats().tiers.promotions == 0 {
        a.progress().unwrap();
        b.progress().unwrap();
    }
}

#[test]
fn regions_announced_to_a_peer_never_go_back_to_the_shared_reservoir() {
    let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
    let shared = Shared::new(&provider, ladder());
    let reservoir = &shared.reservoir;
    reservoir.fill().unwrap();
    let (small, large) = (TierIndex::new(0), TierIndex::new(1));

    let (mut a, mut b) = connected_pair(&provider, &shared);
    promote_with(&mut a, &mut b, 3000);
    assert_eq!((a.stats().send_tier, b.stats().recv_tier), (1, 1));
    // Each side took a send and a receive region of tier 0, `a` a send region of tier 1
    // and `b` a receive region of tier 1, which it announced to `a`. The tiers they
    // replaced went back: `a`'s tier-0 send region as a spare, `b`'s tier-0 receive
    // region, which `a` mapped, deregistered.
    assert_eq!(reservoir.spare(small), SPARES - 3);
    assert_eq!(reservoir.spare(large), SPARES - 2);
    drop(a);
    drop(b);
    // The send regions come back as spares; the receive regions, which each peer mapped,
    // are deregistered.
    assert_eq!(
        reservoir.spare(small),
        SPARES - 2,
        "tier 0: only the send regions are spares again"
    );
    assert_eq!(
        reservoir.spare(large),
        SPARES - 1,
        "tier 1: only the send region is a spare again"
    );

    // A second pair, as a service's next connection with another peer, gets fresh
    // receive regions and still works.
    let (mut c, mut d) = connected_pair(&provider, &shared);
    promote_with(&mut c, &mut d, 3000);
    assert_eq!((c.stats().send_tier, d.stats().recv_tier), (1, 1));
}

#[test]
fn a_region_receives_for_one_peer_only() {
    use tierbuf_pool::SlotPool;
    use tierbuf_transport::{BufferRef, Endpoint, PostError};
    let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
    let pool = SlotPool::new(&*provider.registrar(), 64, 4).unwrap();
    let (mut a, mut b) = provider.pair(4, 4).unwrap();
    let (first, second) = (
        pool.try_acquire_owned().unwrap(),
        pool.try_acquire_owned().unwrap(),
    );
    // SAFETY: the slots stay untouched until the endpoints are dropped.
    unsafe { a.post_recv(BufferRef::from(&first), 1) }.unwrap();
    let remote_key = BufferRef::from(&second).remote_key;
    assert_eq!(
        // SAFETY: as above.
        unsafe { b.post_recv(BufferRef::from(&second), 2) },
        Err(PostError::SharedWithAnotherPeer { remote_key }),
        "the region `a` shared with `b` cannot receive for `a`"
    );
    assert_eq!(
        b.outstanding().recvs,
        0,
        "nothing posted, the endpoint stands"
    );
    // SAFETY: as above.
    unsafe { a.post_recv(BufferRef::from(&second), 3) }.unwrap();
}

/// A region one of whose ranges was exposed for one-sided access (over loopback here,
/// where no memory file is shared) says so for good: the reservoir deregisters it when it
/// is given back instead of lending it to the next connection, whose peer would differ
/// from the one that was told its address and a key. Deregistered while exposed, it is
/// reached no more: the peer's write is refused as with a revoked key.
#[test]
fn a_region_exposed_for_one_sided_access_never_serves_another_connection() {
    use tierbuf_transport::{Access, BufferRef, Endpoint, LoopbackProvider, RemoteBuffer};
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
    let reservoir = Reservoir::new(provider.registrar(), ladder());
    let tier = TierIndex::new(1);
    let (kept, _) = reservoir.take(tier).unwrap();
    let (exposed, _) = reservoir.take(tier).unwrap();
    let (mut writer, mut target) = provider.pair(4, 4).unwrap();
    let keys = exposed.keys();
    let range = BufferRef {
        remote_key: keys.remote_key,
        addr: keys.remote_addr,
        len: 64,
    };
    // SAFETY: the region's bytes are not read or written by this test while exposed.
    let remote: RemoteBuffer = unsafe { target.expose(range, Access::Write) }.unwrap();
    assert!(exposed.exposed_to_peer() && !kept.exposed_to_peer());
    reservoir.give_back(tier, kept);
    reservoir.give_back(tier, exposed);
    assert_eq!(
        reservoir.spare(tier),
        1,
        "only the region never exposed is kept"
    );
    // Deregistered (given back past the shelf's rule): the peer's write is refused.
    let (source, _) = reservoir.take(tier).unwrap();
    let gather = [BufferRef {
        remote_key: source.keys().remote_key,
        addr: source.keys().remote_addr,
        len: 64,
    }];
    // SAFETY: the source is not written while the write is outstanding.
    unsafe { writer.post_write(&gather, remote, None, 1) }.unwrap();
    let mut completions = [tierbuf_transport::Completion::default(); 2];
    assert_eq!(writer.poll(&mut completions).unwrap(), 1);
    assert_eq!(
        completions[0].status,
        tierbuf_transport::CompletionStatus::RemoteAccessError
    );
    target.revoke(remote).unwrap();
}
