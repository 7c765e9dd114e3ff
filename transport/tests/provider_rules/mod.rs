//! The verbs rules every provider keeps (see `Endpoint`), written once and checked on
//! each provider: a test file instantiates them with [`provider_rules!`].
//!
//! Every test leaves a posted buffer alone (no reads, no writes) until its completion has
//! been polled or its endpoint closed; the helpers below rely on that for their `unsafe`.
//! A waiting send moves when its sender calls in (posts or polls), as a provider without
//! a progress engine of its own allows, so the tests poll the sender before the receiver.
//! A device completes requests in its own time (soft-RoCE under an emulated CPU takes
//! milliseconds), so a rule that expects completions polls for them, up to an explicit and
//! generous deadline ([`PATIENCE`]), where the software providers have them at once.

pub(crate) mod one_sided;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_transport::{
    BufferRef, CallerCopies, Completion, CompletionStatus, Endpoint, EndpointState, Opcode,
    Outstanding, PostError, Provider, QueueKind,
};

const SUCCESS: CompletionStatus = CompletionStatus::Success;

/// How long a rule waits for a completion it expects, or for an endpoint to go idle: far
/// longer than any provider takes, an emulated CPU included, so that only a lost request
/// fails a rule.
const PATIENCE: Duration = Duration::from_secs(60);

/// A provider whose endpoints come in connected pairs, for these rules.
pub(crate) trait TestProvider: Provider<Endpoint: 'static> {
    /// Why the provider does not keep the rule for a region deregistered under a queued
    /// request, if it does not. A software provider keeps the memory until the request
    /// completes and fails the request; verbs leaves deregistering memory that a posted
    /// request names undefined, and soft-RoCE answered differently from run to run.
    const DEREGISTRATION_UNDER_A_REQUEST_UNDEFINED: Option<&'static str> = None;

    /// Whether a send copied from the caller's memory is copied into the work request as
    /// it is posted and then waits for the peer's receive as any send does (verbs inline
    /// data), rather than copied straight into a receive the peer has posted, and taken
    /// only when one is (the shm provider).
    const COPIED_SENDS_WAIT_FOR_A_RECEIVE: bool = false;

    /// Why the rules cannot run here (no device, say), or `None` when they can.
    fn unavailable() -> Option<String> {
        None
    }
    /// A provider charging `budget`.
    fn with_budget(budget: MemoryBudget) -> Self;
    /// Two connected endpoints of the given depths.
    fn connect_pair(&self, send_depth: u32, recv_depth: u32) -> (Self::Endpoint, Self::Endpoint);
}

/// Whether the rules skip on provider `P`, saying why when they do.
pub(crate) fn skipped<P: TestProvider>() -> bool {
    match P::unavailable() {
        Some(reason) => {
            println!("skipped: {reason}");
            true
        }
        None => false,
    }
}

fn provider<P: TestProvider>() -> P {
    P::with_budget(MemoryBudget::with_cap(64 << 20))
}

fn pool<P: TestProvider>(provider: &P, slot_size: usize, slots: usize) -> SlotPool {
    SlotPool::new(&*provider.registrar(), slot_size, slots).unwrap()
}

/// A pool of `slots` slots of `slot_size` bytes and a pair of endpoints of the given
/// depths, all from one provider.
fn fixture<P: TestProvider>(
    slot_size: usize,
    slots: usize,
    send_depth: u32,
    recv_depth: u32,
) -> (SlotPool, P::Endpoint, P::Endpoint) {
    let provider = provider::<P>();
    let pool = pool(&provider, slot_size, slots);
    let (a, b) = provider.connect_pair(send_depth, recv_depth);
    (pool, a, b)
}

fn send<E: Endpoint>(endpoint: &mut E, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
    // SAFETY: the tests in this file leave posted buffers alone until their completions
    // are polled or the endpoint is closed (see the file's header).
    unsafe { endpoint.post_send(gather, wr_id) }
}

fn recv<E: Endpoint>(endpoint: &mut E, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
    // SAFETY: as for `send`.
    unsafe { endpoint.post_recv(buffer, wr_id) }
}

/// Every completion available now.
fn poll_all<E: Endpoint>(endpoint: &mut E) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut batch = [Completion::default(); 3];
    loop {
        let n = endpoint.poll(&mut batch).unwrap();
        all.extend_from_slice(&batch[..n]);
        if n == 0 {
            return all;
        }
    }
}

/// Polls until at least `count` completions have come, failing past [`PATIENCE`]; returns
/// every completion taken, so that a rule's assertion sees any beyond `count` that had
/// come by then.
fn poll_for<E: Endpoint>(endpoint: &mut E, count: usize) -> Vec<Completion> {
    let deadline = Instant::now() + PATIENCE;
    let mut all = poll_all(endpoint);
    while all.len() < count {
        assert!(
            Instant::now() < deadline,
            "{} of {count} completions came within {PATIENCE:?}: {all:?}",
            all.len()
        );
        std::thread::yield_now();
        all.extend(poll_all(endpoint));
    }
    all
}

fn completion(wr_id: u64, byte_len: u32, status: CompletionStatus, opcode: Opcode) -> Completion {
    Completion {
        wr_id,
        byte_len,
        status,
        opcode,
    }
}

/// The byte at `offset` of message `index`: differs between neighbouring messages and
/// neighbouring offsets.
fn pattern(index: u64, offset: usize) -> u8 {
    (index as usize).wrapping_mul(31).wrapping_add(offset * 7) as u8
}

fn fill_message(slot: &mut OwnedSlot, index: u64, len: usize) {
    for (offset, byte) in slot[..len].iter_mut().enumerate() {
        *byte = pattern(index, offset);
    }
}

fn is_message(bytes: &[u8], index: u64) -> bool {
    bytes
        .iter()
        .enumerate()
        .all(|(offset, &byte)| byte == pattern(index, offset))
}

pub(crate) fn messages_arrive_byte_for_byte_in_order<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 16, 4, 4);
    for round in 0..50u64 {
        let mut inboxes = Vec::new();
        let mut messages = Vec::new();
        for i in 0..4 {
            let inbox = pool.try_acquire_owned().unwrap();
            recv(&mut b, BufferRef::from(&inbox), round * 4 + i).unwrap();
            inboxes.push(inbox);
        }
        for i in 0..4 {
            let index = round * 4 + i;
            let len = (index as usize * 37) % 256 + 1;
            let mut message = pool.try_acquire_owned().unwrap();
            fill_message(&mut message, index, len);
            let buffer = BufferRef::from(&message).prefix(len as u32).unwrap();
            send(&mut a, &[buffer], index).unwrap();
            messages.push((message, len));
        }
        let sent = poll_for(&mut a, 4);
        let expected: Vec<_> = (0..4)
            .map(|i| completion(round * 4 + i, 0, SUCCESS, Opcode::Send))
            .collect();
        assert_eq!(sent, expected);
        let received = poll_for(&mut b, 4);
        assert_eq!(received.len(), 4);
        for (i, done) in received.iter().enumerate() {
            let index = round * 4 + i as u64;
            let len = messages[i].1;
            assert_eq!(*done, completion(index, len as u32, SUCCESS, Opcode::Recv));
            assert!(is_message(&inboxes[i][..len], index), "message {index}");
        }
    }
    assert_eq!(a.outstanding(), Outstanding::default());
    assert_eq!(b.outstanding(), Outstanding::default());
}

pub(crate) fn gather_lists_are_concatenated_and_limited<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(64, 8, 4, 4);
    let limits = a.limits();
    let mut parts: Vec<OwnedSlot> = (0..3).map(|_| pool.try_acquire_owned().unwrap()).collect();
    for (i, part) in parts.iter_mut().enumerate() {
        part.fill(b'a' + i as u8);
    }
    let inbox = pool.try_acquire_owned().unwrap();
    recv(&mut b, BufferRef::from(&inbox), 1).unwrap();
    // As many of these as the endpoint gathers (a verbs endpoint takes one), an empty one
    // among them.
    let lens = [3u32, 0, 5];
    let gather: Vec<BufferRef> = lens
        .iter()
        .zip(&parts)
        .take(limits.max_gather)
        .map(|(&len, part)| BufferRef::from(part).prefix(len).unwrap())
        .collect();
    let expected: Vec<u8> = lens
        .iter()
        .take(limits.max_gather)
        .enumerate()
        .flat_map(|(i, &len)| std::iter::repeat_n(b'a' + i as u8, len as usize))
        .collect();
    send(&mut a, &gather, 2).unwrap();
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(1, expected.len() as u32, SUCCESS, Opcode::Recv)]
    );
    assert_eq!(&inbox[..expected.len()], &expected[..]);

    let too_many = vec![BufferRef::from(&parts[0]); limits.max_gather + 1];
    assert_eq!(
        send(&mut a, &too_many, 3),
        Err(PostError::TooManyBuffers {
            given: limits.max_gather + 1,
            max: limits.max_gather
        })
    );
    // Longer than one message carries, whether in one buffer or two.
    let huge = BufferRef {
        len: u32::MAX,
        ..BufferRef::from(&parts[0])
    };
    let huge_gather = vec![huge; limits.max_gather.min(2)];
    let huge_len = huge_gather.len() as u64 * u64::from(u32::MAX);
    assert!(huge_len > u64::from(limits.max_message), "{limits:?}");
    assert_eq!(
        send(&mut a, &huge_gather, 3),
        Err(PostError::MessageTooLong {
            len: huge_len,
            max: limits.max_message
        })
    );
    // An empty gather list sends an empty message.
    recv(&mut b, BufferRef::from(&inbox), 4).unwrap();
    send(&mut a, &[], 5).unwrap();
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(4, 0, SUCCESS, Opcode::Recv)]
    );
    assert_eq!(
        poll_for(&mut a, 2),
        [
            completion(2, 0, SUCCESS, Opcode::Send),
            completion(5, 0, SUCCESS, Opcode::Send)
        ]
    );
}

pub(crate) fn a_message_of_exactly_the_receive_length_is_delivered<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 4, 2, 2);
    let mut inbox = pool.try_acquire_owned().unwrap();
    inbox.fill(0xEE);
    let mut message = pool.try_acquire_owned().unwrap();
    fill_message(&mut message, 9, 100);
    recv(&mut b, BufferRef::from(&inbox).prefix(100).unwrap(), 1).unwrap();
    send(&mut a, &[BufferRef::from(&message).prefix(100).unwrap()], 2).unwrap();
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(1, 100, SUCCESS, Opcode::Recv)]
    );
    assert_eq!(
        poll_for(&mut a, 1),
        [completion(2, 0, SUCCESS, Opcode::Send)]
    );
    assert!(is_message(&inbox[..100], 9));
    assert!(
        inbox[100..].iter().all(|&guard| guard == 0xEE),
        "guard bytes"
    );
    assert_eq!(a.state(), EndpointState::Open);
}

pub(crate) fn a_message_one_byte_longer_than_the_receive_is_a_length_error<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 4, 2, 2);
    let mut inbox = pool.try_acquire_owned().unwrap();
    inbox.fill(0xEE);
    let spare = pool.try_acquire_owned().unwrap();
    let mut message = pool.try_acquire_owned().unwrap();
    fill_message(&mut message, 3, 101);
    recv(&mut b, BufferRef::from(&inbox).prefix(100).unwrap(), 1).unwrap();
    recv(&mut b, BufferRef::from(&spare), 2).unwrap();
    send(&mut a, &[BufferRef::from(&message).prefix(101).unwrap()], 3).unwrap();
    // The too-short receive fails, the error breaks the connection, the next receive is
    // flushed, and no byte past the receive buffer (the guard after it) was written. How
    // the failure reads depends on who checks the length: the software providers, and
    // most NICs, report a length error at the receiver and an invalid request at the
    // sender; soft-RoCE fails the receive's work request as a whole (a local operation
    // error) and the sender sees the peer's operation fail.
    let received = poll_for(&mut b, 2);
    assert_eq!(received.len(), 2, "{received:?}");
    assert!(
        matches!(
            received[0].status,
            CompletionStatus::LocalLengthError | CompletionStatus::LocalOperationError
        ),
        "{received:?}"
    );
    assert_eq!(
        received,
        [
            completion(1, 0, received[0].status, Opcode::Recv),
            completion(2, 0, CompletionStatus::Flushed, Opcode::Recv),
        ]
    );
    let sent = poll_for(&mut a, 1);
    assert!(
        matches!(
            sent[..],
            [Completion {
                wr_id: 3,
                byte_len: 0,
                status: CompletionStatus::RemoteInvalidRequest
                    | CompletionStatus::RemoteOperationError,
                opcode: Opcode::Send,
            }]
        ),
        "{sent:?}"
    );
    assert!(inbox[100..].iter().all(|&byte| byte == 0xEE), "guard bytes");
    assert_eq!(
        (a.state(), b.state()),
        (EndpointState::Broken, EndpointState::Broken)
    );
    assert_eq!(
        send(&mut a, &[BufferRef::from(&message)], 4),
        Err(PostError::ConnectionBroken)
    );
}

pub(crate) fn a_send_without_a_posted_receive_waits_for_one<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(128, 4, 2, 2);
    let mut message = pool.try_acquire_owned().unwrap();
    fill_message(&mut message, 5, 128);
    send(&mut a, &[BufferRef::from(&message)], 7).unwrap();
    for _ in 0..100 {
        assert!(poll_all(&mut a).is_empty());
        assert!(poll_all(&mut b).is_empty());
    }
    assert_eq!(a.outstanding(), Outstanding { sends: 1, recvs: 0 });
    let inbox = pool.try_acquire_owned().unwrap();
    recv(&mut b, BufferRef::from(&inbox), 8).unwrap();
    // The sender sees its completion without the receiver polling first.
    assert_eq!(
        poll_for(&mut a, 1),
        [completion(7, 0, SUCCESS, Opcode::Send)]
    );
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(8, 128, SUCCESS, Opcode::Recv)]
    );
    assert!(is_message(&inbox, 5));
}

pub(crate) fn unknown_keys_and_out_of_bounds_buffers_are_refused<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 4, 2, 2);
    let slot = pool.try_acquire_owned().unwrap();
    // The region may be longer than the four slots (a device registers whole pages).
    let region_len = pool.region_len();
    let whole_region = BufferRef {
        remote_key: pool.keys().remote_key,
        addr: pool.keys().remote_addr,
        len: region_len as u32,
    };
    let unknown = BufferRef {
        remote_key: 0xDEAD_BEEF,
        ..whole_region
    };
    assert_eq!(
        recv(&mut b, unknown, 1),
        Err(PostError::UnknownKey {
            remote_key: 0xDEAD_BEEF
        })
    );
    assert_eq!(
        send(&mut a, &[unknown], 1),
        Err(PostError::UnknownKey {
            remote_key: 0xDEAD_BEEF
        })
    );

    // Memory registered with another registrar is refused: its key is unknown here, or
    // (keys are per registrar, as per protection domain) names another region, whose
    // bounds the foreign address is not within.
    let foreign = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    let foreign_pool = SlotPool::new(&foreign, 256, 1).unwrap();
    let foreign_slot = foreign_pool.try_acquire_owned().unwrap();
    assert!(matches!(
        send(&mut a, &[BufferRef::from(&foreign_slot)], 2),
        Err(PostError::UnknownKey { .. } | PostError::OutOfBounds { .. })
    ));

    let out_of_bounds = [
        BufferRef {
            len: region_len as u32 + 1,
            ..whole_region
        },
        BufferRef {
            addr: whole_region.addr - 1,
            len: 1,
            ..whole_region
        },
        BufferRef {
            addr: whole_region.addr + region_len as u64,
            len: 1,
            ..whole_region
        },
        BufferRef {
            addr: u64::MAX,
            len: u32::MAX,
            ..whole_region
        },
    ];
    for buffer in out_of_bounds {
        assert!(
            matches!(recv(&mut b, buffer, 3), Err(PostError::OutOfBounds { remote_key, region_len: len, .. }) if remote_key == buffer.remote_key && len == region_len),
            "{buffer:?}"
        );
        // Behind a good buffer where the endpoint gathers more than one.
        let mut gather = vec![BufferRef::from(&slot).prefix(0).unwrap(), buffer];
        if a.limits().max_gather < 2 {
            gather.remove(0);
        }
        // A buffer longer than one message may be refused for that first.
        let too_long = u64::from(buffer.len) > u64::from(a.limits().max_message);
        let refused = send(&mut a, &gather, 3);
        assert!(
            matches!(refused, Err(PostError::OutOfBounds { .. }))
                || too_long && matches!(refused, Err(PostError::MessageTooLong { .. })),
            "{buffer:?}: {refused:?}"
        );
    }
    // Nothing refused was queued; the whole region and the empty end are fine.
    assert_eq!(a.outstanding(), Outstanding::default());
    assert_eq!(b.outstanding(), Outstanding::default());
    let end = BufferRef {
        addr: whole_region.addr + region_len as u64,
        len: 0,
        ..whole_region
    };
    send(&mut a, &[end], 4).unwrap();
    drop(slot);
    recv(&mut b, whole_region, 5).unwrap();
    assert_eq!(
        poll_for(&mut a, 1),
        [completion(4, 0, SUCCESS, Opcode::Send)]
    );
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(5, 0, SUCCESS, Opcode::Recv)]
    );

    // A deregistered region's key is unknown.
    let key = pool.keys().remote_key;
    drop(pool);
    assert_eq!(
        recv(&mut b, whole_region, 6),
        Err(PostError::UnknownKey { remote_key: key })
    );
}

pub(crate) fn a_region_deregistered_under_a_queued_send_fails_it_without_freeing_early<
    P: TestProvider,
>() {
    if let Some(why) = P::DEREGISTRATION_UNDER_A_REQUEST_UNDEFINED {
        println!("not a rule of this provider: {why}");
        return;
    }
    let provider = provider::<P>();
    let registrar = provider.registrar();
    let pool = pool(&provider, 4096, 1);
    let (mut a, mut b) = provider.connect_pair(2, 2);
    // What the pool and the endpoints hold, and what the region adds (a provider may
    // charge more than the bytes asked for: whole pages, say).
    let before = registrar.budget().in_use();
    let region = registrar.register(4096, 4096).unwrap();
    let region_cost = registrar.budget().in_use() - before;
    assert!(region_cost >= 4096, "{region_cost}");
    let keys = region.keys();
    let message = BufferRef {
        remote_key: keys.remote_key,
        addr: keys.remote_addr,
        len: 64,
    };
    send(&mut a, &[message], 1).unwrap();
    drop(region);
    // The provider keeps the memory (and its budget) until the queued send completes.
    assert_eq!(registrar.budget().in_use(), before + region_cost);
    let inbox = pool.try_acquire_owned().unwrap();
    recv(&mut b, BufferRef::from(&inbox), 2).unwrap();
    assert_eq!(
        poll_for(&mut a, 1),
        [completion(
            1,
            0,
            CompletionStatus::LocalProtectionError,
            Opcode::Send
        )]
    );
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(2, 0, CompletionStatus::Flushed, Opcode::Recv)]
    );
    assert_eq!(registrar.budget().in_use(), before);
    assert_eq!(a.state(), EndpointState::Broken);
}

pub(crate) fn receives_are_consumed_in_posting_order<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 16, 8, 8);
    // Only in-order pairing fits every message into its receive: any other order puts a
    // message into a shorter buffer (a length error) or shows in the contents.
    let sizes = [32u32, 200, 8, 100, 1, 256];
    let mut inboxes = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let inbox = pool.try_acquire_owned().unwrap();
        recv(
            &mut b,
            BufferRef::from(&inbox).prefix(size).unwrap(),
            i as u64,
        )
        .unwrap();
        inboxes.push(inbox);
    }
    let mut messages = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let mut message = pool.try_acquire_owned().unwrap();
        fill_message(&mut message, 100 + i as u64, size as usize);
        send(
            &mut a,
            &[BufferRef::from(&message).prefix(size).unwrap()],
            50 + i as u64,
        )
        .unwrap();
        messages.push(message);
    }
    let received = poll_for(&mut b, 6);
    let expected: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| completion(i as u64, size, SUCCESS, Opcode::Recv))
        .collect();
    assert_eq!(received, expected);
    for (i, &size) in sizes.iter().enumerate() {
        assert!(is_message(&inboxes[i][..size as usize], 100 + i as u64));
    }
}

pub(crate) fn posting_past_a_queue_depth_is_refused_until_completions_are_polled<
    P: TestProvider,
>() {
    let (pool, mut a, mut b) = fixture::<P>(64, 16, 2, 3);
    let slots: Vec<OwnedSlot> = (0..8).map(|_| pool.try_acquire_owned().unwrap()).collect();
    let buffer = |i: usize| BufferRef::from(&slots[i]);
    send(&mut a, &[buffer(0)], 0).unwrap();
    send(&mut a, &[buffer(1)], 1).unwrap();
    let full = |queue, depth| Err(PostError::QueueFull { queue, depth });
    assert_eq!(send(&mut a, &[buffer(2)], 2), full(QueueKind::Send, 2));

    recv(&mut b, buffer(3), 3).unwrap();
    recv(&mut b, buffer(4), 4).unwrap();
    recv(&mut b, buffer(5), 5).unwrap();
    // Two receives completed, but stay outstanding until polled.
    assert_eq!(recv(&mut b, buffer(6), 6), full(QueueKind::Recv, 3));
    assert_eq!(send(&mut a, &[buffer(2)], 2), full(QueueKind::Send, 2));

    assert_eq!(poll_for(&mut a, 2).len(), 2);
    assert_eq!(poll_for(&mut b, 2).len(), 2);
    recv(&mut b, buffer(6), 6).unwrap();
    send(&mut a, &[buffer(2)], 2).unwrap();
    assert_eq!(
        poll_for(&mut a, 1),
        [completion(2, 0, SUCCESS, Opcode::Send)]
    );
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(5, 64, SUCCESS, Opcode::Recv)]
    );
    assert_eq!(b.outstanding(), Outstanding { sends: 0, recvs: 1 });
}

pub(crate) fn closing_flushes_the_outstanding_requests_of_both_sides<P: TestProvider>() {
    let provider = provider::<P>();
    // A region receives for one side only (the shm provider shares it with that peer).
    let (pool_a, pool_b) = (pool(&provider, 64, 8), pool(&provider, 64, 8));
    let (mut a, mut b) = provider.connect_pair(4, 4);
    let slots: Vec<OwnedSlot> = (0..2)
        .map(|_| pool_a.try_acquire_owned().unwrap())
        .collect();
    let slot_b = pool_b.try_acquire_owned().unwrap();
    recv(&mut a, BufferRef::from(&slots[0]), 1).unwrap();
    recv(&mut a, BufferRef::from(&slots[1]), 2).unwrap();
    recv(&mut b, BufferRef::from(&slot_b), 3).unwrap();
    a.close();
    a.close();
    let flushed = |wr_id| completion(wr_id, 0, CompletionStatus::Flushed, Opcode::Recv);
    assert_eq!(poll_for(&mut a, 2), [flushed(1), flushed(2)]);
    assert_eq!(poll_for(&mut b, 1), [flushed(3)]);
    assert_eq!(
        (a.state(), b.state()),
        (EndpointState::Closed, EndpointState::PeerClosed)
    );
    assert_eq!(
        recv(&mut a, BufferRef::from(&slots[0]), 4),
        Err(PostError::Closed)
    );
    assert_eq!(
        send(&mut b, &[BufferRef::from(&slot_b)], 5),
        Err(PostError::PeerClosed)
    );
    assert_eq!(a.outstanding(), Outstanding::default());
    assert_eq!(b.outstanding(), Outstanding::default());
}

pub(crate) fn dropping_an_endpoint_flushes_the_waiting_sends_of_its_peer<P: TestProvider>() {
    let provider = provider::<P>();
    let budget = provider.registrar().budget().clone();
    let pool = pool(&provider, 64, 4);
    let (mut a, b) = provider.connect_pair(4, 4);
    let message = pool.try_acquire_owned().unwrap();
    send(&mut a, &[BufferRef::from(&message)], 1).unwrap();
    send(&mut a, &[BufferRef::from(&message)], 2).unwrap();
    drop(b);
    let flushed = |wr_id| completion(wr_id, 0, CompletionStatus::Flushed, Opcode::Send);
    assert_eq!(poll_for(&mut a, 2), [flushed(1), flushed(2)]);
    assert_eq!(a.state(), EndpointState::PeerClosed);
    drop((a, message, pool));
    assert_eq!(budget.in_use(), 0, "every registered byte returned");
}

pub(crate) fn a_sender_and_a_receiver_on_two_threads_exchange_thousands_of_messages<
    P: TestProvider,
>() {
    const MESSAGES: u64 = 20_000;
    const DEPTH: u32 = 16;
    let provider = provider::<P>();
    let send_pool = pool(&provider, 256, DEPTH as usize);
    let recv_pool = pool(&provider, 256, DEPTH as usize);
    let (mut a, mut b) = provider.connect_pair(DEPTH, DEPTH);
    let length = |index: u64| (index * 13 % 256 + 1) as usize;

    let sender = std::thread::spawn(move || {
        let mut in_flight: HashMap<u64, OwnedSlot> = HashMap::new();
        let mut next = 0;
        let mut completed = 0;
        let mut batch = [Completion::default(); 8];
        while completed < MESSAGES {
            while next < MESSAGES && a.outstanding().sends < DEPTH {
                let mut slot = send_pool.try_acquire_owned().unwrap();
                fill_message(&mut slot, next, length(next));
                let buffer = BufferRef::from(&slot).prefix(length(next) as u32).unwrap();
                send(&mut a, &[buffer], next).unwrap();
                in_flight.insert(next, slot);
                next += 1;
            }
            let n = a.poll(&mut batch).unwrap();
            for done in &batch[..n] {
                assert_eq!(*done, completion(completed, 0, SUCCESS, Opcode::Send));
                in_flight.remove(&done.wr_id).unwrap();
                completed += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        a
    });

    let mut posted: HashMap<u64, OwnedSlot> = HashMap::new();
    let mut next_recv = 0;
    let mut received = 0;
    let mut batch = [Completion::default(); 8];
    while received < MESSAGES {
        while next_recv < MESSAGES && b.outstanding().recvs < DEPTH {
            let slot = recv_pool.try_acquire_owned().unwrap();
            recv(&mut b, BufferRef::from(&slot), next_recv).unwrap();
            posted.insert(next_recv, slot);
            next_recv += 1;
        }
        let n = b.poll(&mut batch).unwrap();
        for done in &batch[..n] {
            let len = length(received);
            assert_eq!(
                *done,
                completion(received, len as u32, SUCCESS, Opcode::Recv)
            );
            let slot = posted.remove(&done.wr_id).unwrap();
            assert!(is_message(&slot[..len], received), "message {received}");
            received += 1;
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    let a = sender.join().unwrap();
    assert_eq!(a.outstanding(), Outstanding::default());
    assert_eq!(b.outstanding(), Outstanding::default());
}

/// Polls until nothing is outstanding, failing past [`PATIENCE`] rather than hanging if a
/// request is lost.
fn poll_until_idle<E: Endpoint>(endpoint: &mut E) -> Vec<Completion> {
    let deadline = Instant::now() + PATIENCE;
    let mut all = Vec::new();
    while endpoint.outstanding() != Outstanding::default() {
        assert!(
            Instant::now() < deadline,
            "requests never completed: {:?} outstanding after {PATIENCE:?}",
            endpoint.outstanding()
        );
        all.extend(poll_all(endpoint));
        std::thread::yield_now();
    }
    all
}

pub(crate) fn closing_during_traffic_completes_every_request_exactly_once<P: TestProvider>() {
    for round in 0..8u64 {
        let provider = provider::<P>();
        let send_pool = pool(&provider, 64, 8);
        let recv_pool = pool(&provider, 64, 8);
        let (mut a, mut b) = provider.connect_pair(8, 8);
        let sender = std::thread::spawn(move || {
            let mut held: HashMap<u64, OwnedSlot> = HashMap::new();
            let mut completions = Vec::new();
            let mut next = 0;
            loop {
                if a.outstanding().sends < 8 {
                    let slot = send_pool.try_acquire_owned().unwrap();
                    match send(&mut a, &[BufferRef::from(&slot)], next) {
                        Ok(()) => {
                            held.insert(next, slot);
                            next += 1;
                        }
                        Err(PostError::PeerClosed) => break,
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
                for done in poll_all(&mut a) {
                    held.remove(&done.wr_id).unwrap();
                    completions.push(done);
                }
            }
            for done in poll_until_idle(&mut a) {
                held.remove(&done.wr_id).unwrap();
                completions.push(done);
            }
            assert!(held.is_empty());
            (next, completions)
        });
        let mut held: HashMap<u64, OwnedSlot> = HashMap::new();
        let mut received = 0;
        let mut next = 0;
        while received < 200 + round * 50 {
            if b.outstanding().recvs < 8 {
                let slot = recv_pool.try_acquire_owned().unwrap();
                recv(&mut b, BufferRef::from(&slot), next).unwrap();
                held.insert(next, slot);
                next += 1;
            }
            for done in poll_all(&mut b) {
                assert_eq!(done.status, SUCCESS);
                held.remove(&done.wr_id).unwrap();
                received += 1;
            }
        }
        b.close();
        for done in poll_until_idle(&mut b) {
            assert!(matches!(done.status, SUCCESS | CompletionStatus::Flushed));
            held.remove(&done.wr_id).unwrap();
        }
        assert!(held.is_empty());
        let (posted, completions) = sender.join().unwrap();
        // Every posted send completed once, in posting order, successes before flushes.
        let ids: Vec<u64> = completions.iter().map(|done| done.wr_id).collect();
        assert_eq!(ids, (0..posted).collect::<Vec<_>>());
        let successes = completions
            .iter()
            .take_while(|d| d.status == SUCCESS)
            .count();
        assert!(
            completions[successes..]
                .iter()
                .all(|done| done.status == CompletionStatus::Flushed)
        );
        assert!(successes as u64 >= received);
    }
}

/// A send copied from the caller's memory goes at once, behind nothing, or takes nothing:
/// not with no receive posted, not behind a send waiting for one; once taken it is
/// delivered byte for byte, in order with sends from registered memory, and completes as
/// they do. A provider that cannot copy from the caller's memory takes none.
pub(crate) fn a_send_copied_from_the_callers_memory_goes_at_once_or_takes_nothing<
    P: TestProvider,
>() {
    if P::COPIED_SENDS_WAIT_FOR_A_RECEIVE {
        return copied_sends_are_taken_at_once_and_wait_for_a_receive::<P>();
    }
    let (pool, mut a, mut b) = fixture::<P>(256, 8, 4, 4);
    let message: Vec<u8> = (0..200).map(|offset| pattern(1, offset)).collect();
    let (head, tail) = message.split_at(150);
    assert!(
        !a.try_post_send_copied(&[head, tail], 1).unwrap(),
        "no receive posted"
    );
    assert_eq!(a.outstanding(), Outstanding::default(), "nothing taken");
    let inboxes: Vec<OwnedSlot> = (0..3).map(|_| pool.try_acquire_owned().unwrap()).collect();
    recv(&mut b, BufferRef::from(&inboxes[0]), 10).unwrap();
    if a.caller_copies() == CallerCopies::NONE {
        assert!(!a.try_post_send_copied(&[head, tail], 1).unwrap());
        assert_eq!(a.outstanding(), Outstanding::default());
        return;
    }
    assert!(a.try_post_send_copied(&[head, tail], 1).unwrap());
    // A registered send waits for a receive; a copied one may not pass it.
    let mut registered = pool.try_acquire_owned().unwrap();
    fill_message(&mut registered, 2, 64);
    send(
        &mut a,
        &[BufferRef::from(&registered).prefix(64).unwrap()],
        2,
    )
    .unwrap();
    let small = [pattern(3, 0), pattern(3, 1)];
    assert!(
        !a.try_post_send_copied(&[&small], 3).unwrap(),
        "a send waits ahead"
    );
    recv(&mut b, BufferRef::from(&inboxes[1]), 11).unwrap();
    assert_eq!(
        poll_for(&mut a, 2),
        vec![
            completion(1, 0, SUCCESS, Opcode::Send),
            completion(2, 0, SUCCESS, Opcode::Send)
        ]
    );
    assert!(
        !a.try_post_send_copied(&[&small], 3).unwrap(),
        "nothing ahead, but no receive posted"
    );
    recv(&mut b, BufferRef::from(&inboxes[2]), 12).unwrap();
    assert!(a.try_post_send_copied(&[&small], 3).unwrap());
    assert_eq!(
        poll_for(&mut a, 1),
        vec![completion(3, 0, SUCCESS, Opcode::Send)]
    );
    assert_eq!(
        poll_for(&mut b, 3),
        vec![
            completion(10, 200, SUCCESS, Opcode::Recv),
            completion(11, 64, SUCCESS, Opcode::Recv),
            completion(12, 2, SUCCESS, Opcode::Recv),
        ]
    );
    assert_eq!(&inboxes[0][..200], &message[..]);
    assert!(is_message(&inboxes[1][..64], 2));
    assert_eq!(&inboxes[2][..2], &small);
}

/// The rule above for a provider whose copied sends wait for the peer's receives: a send
/// of a length [`Endpoint::caller_copies`] takes is taken whether or not a receive is
/// posted, and nothing of it is read after the call; it is delivered byte for byte, in
/// order with the sends from registered memory around it, and completes as they do. A
/// longer one is not taken.
fn copied_sends_are_taken_at_once_and_wait_for_a_receive<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 8, 4, 4);
    let copies = a.caller_copies();
    let longest = (1..=256).take_while(|&len| copies.takes(len)).last();
    let Some(longest) = longest else {
        let message = [pattern(1, 0)];
        assert!(!a.try_post_send_copied(&[&message], 1).unwrap());
        assert_eq!(a.outstanding(), Outstanding::default());
        return;
    };
    let too_long: Vec<u8> = (0..=longest).map(|offset| pattern(9, offset)).collect();
    assert!(
        !a.try_post_send_copied(&[&too_long], 9).unwrap(),
        "longer than the endpoint copies"
    );
    assert_eq!(a.outstanding(), Outstanding::default(), "nothing taken");
    let mut message: Vec<u8> = (0..longest).map(|offset| pattern(1, offset)).collect();
    let (head, tail) = message.split_at(longest / 2);
    assert!(
        a.try_post_send_copied(&[head, tail], 1).unwrap(),
        "taken with no receive posted"
    );
    // Nothing of the caller's memory is read after the call.
    message.fill(0);
    let mut registered = pool.try_acquire_owned().unwrap();
    fill_message(&mut registered, 2, 64);
    send(
        &mut a,
        &[BufferRef::from(&registered).prefix(64).unwrap()],
        2,
    )
    .unwrap();
    let small = [pattern(3, 0), pattern(3, 1)];
    assert!(
        a.try_post_send_copied(&[&small], 3).unwrap(),
        "behind a waiting send"
    );
    assert_eq!(a.outstanding().sends, 3);
    let inboxes: Vec<OwnedSlot> = (0..3).map(|_| pool.try_acquire_owned().unwrap()).collect();
    for (index, inbox) in inboxes.iter().enumerate() {
        recv(&mut b, BufferRef::from(inbox), 10 + index as u64).unwrap();
    }
    assert_eq!(
        poll_for(&mut a, 3),
        vec![
            completion(1, 0, SUCCESS, Opcode::Send),
            completion(2, 0, SUCCESS, Opcode::Send),
            completion(3, 0, SUCCESS, Opcode::Send),
        ]
    );
    assert_eq!(
        poll_for(&mut b, 3),
        vec![
            completion(10, longest as u32, SUCCESS, Opcode::Recv),
            completion(11, 64, SUCCESS, Opcode::Recv),
            completion(12, 2, SUCCESS, Opcode::Recv),
        ]
    );
    let expected: Vec<u8> = (0..longest).map(|offset| pattern(1, offset)).collect();
    assert_eq!(&inboxes[0][..longest], &expected[..]);
    assert!(is_message(&inboxes[1][..64], 2));
    assert_eq!(&inboxes[2][..2], &small);
}

/// Instantiates every rule above as a `#[test]` for the provider type given; each passes
/// with the reason printed where the provider is unavailable here.
#[macro_export]
macro_rules! provider_rules {
    ($provider:ty) => {
        #[test]
        fn messages_arrive_byte_for_byte_in_order() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::messages_arrive_byte_for_byte_in_order::<$provider>();
        }
        #[test]
        fn gather_lists_are_concatenated_and_limited() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::gather_lists_are_concatenated_and_limited::<$provider>();
        }
        #[test]
        fn a_message_of_exactly_the_receive_length_is_delivered() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_message_of_exactly_the_receive_length_is_delivered::<$provider>();
        }
        #[test]
        fn a_message_one_byte_longer_than_the_receive_is_a_length_error() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_message_one_byte_longer_than_the_receive_is_a_length_error::<$provider>();
        }
        #[test]
        fn a_send_without_a_posted_receive_waits_for_one() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_send_without_a_posted_receive_waits_for_one::<$provider>();
        }
        #[test]
        fn unknown_keys_and_out_of_bounds_buffers_are_refused() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::unknown_keys_and_out_of_bounds_buffers_are_refused::<$provider>();
        }
        #[test]
        fn a_region_deregistered_under_a_queued_send_fails_it_without_freeing_early() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_region_deregistered_under_a_queued_send_fails_it_without_freeing_early::<$provider>();
        }
        #[test]
        fn receives_are_consumed_in_posting_order() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::receives_are_consumed_in_posting_order::<$provider>();
        }
        #[test]
        fn posting_past_a_queue_depth_is_refused_until_completions_are_polled() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::posting_past_a_queue_depth_is_refused_until_completions_are_polled::<$provider>();
        }
        #[test]
        fn closing_flushes_the_outstanding_requests_of_both_sides() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::closing_flushes_the_outstanding_requests_of_both_sides::<$provider>();
        }
        #[test]
        fn dropping_an_endpoint_flushes_the_waiting_sends_of_its_peer() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::dropping_an_endpoint_flushes_the_waiting_sends_of_its_peer::<$provider>();
        }
        #[test]
        fn a_sender_and_a_receiver_on_two_threads_exchange_thousands_of_messages() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_sender_and_a_receiver_on_two_threads_exchange_thousands_of_messages::<$provider>();
        }
        #[test]
        fn a_send_copied_from_the_callers_memory_goes_at_once_or_takes_nothing() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::a_send_copied_from_the_callers_memory_goes_at_once_or_takes_nothing::<$provider>();
        }
        #[test]
        fn closing_during_traffic_completes_every_request_exactly_once() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::closing_during_traffic_completes_every_request_exactly_once::<$provider>();
        }
        #[test]
        fn a_write_with_an_immediate_lands_before_its_receive_completes() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_write_with_an_immediate_lands_before_its_receive_completes::<$provider>();
        }
        #[test]
        fn a_write_without_an_immediate_completes_only_at_the_writer() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_write_without_an_immediate_completes_only_at_the_writer::<$provider>();
        }
        #[test]
        fn a_read_copies_the_exposed_range() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_read_copies_the_exposed_range::<$provider>();
        }
        #[test]
        fn writes_and_reads_complete_in_order_with_the_sends() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::writes_and_reads_complete_in_order_with_the_sends::<$provider>();
        }
        #[test]
        fn posting_mistakes_are_refused_at_once() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::posting_mistakes_are_refused_at_once::<$provider>();
        }
        #[test]
        fn exposures_past_the_limit_are_refused_until_one_is_revoked() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::exposures_past_the_limit_are_refused_until_one_is_revoked::<$provider>();
        }
        #[test]
        fn a_revoked_key_is_refused_and_touches_nothing() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_revoked_key_is_refused_and_touches_nothing::<$provider>();
        }
        #[test]
        fn a_write_outside_the_exposed_range_is_refused() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_write_outside_the_exposed_range_is_refused::<$provider>();
        }
        #[test]
        fn a_read_past_the_advertised_range_is_refused() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::a_read_past_the_advertised_range_is_refused::<$provider>();
        }
        #[test]
        fn an_exposure_for_reads_refuses_writes() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::an_exposure_for_reads_refuses_writes::<$provider>();
        }
        #[test]
        fn another_connections_key_is_refused() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::another_connections_key_is_refused::<$provider>();
        }
        #[test]
        fn closing_flushes_waiting_writes_and_keeps_exposed_bytes() {
            if provider_rules::skipped::<$provider>() {
                return;
            }
            provider_rules::one_sided::closing_flushes_waiting_writes_and_keeps_exposed_bytes::<$provider>();
        }
    };
}
