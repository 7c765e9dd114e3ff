//! The one-sided rules (see `Endpoint`, "The one-sided rules"): exposures, writes with and
//! without an immediate, reads, their order with the sends, and what a peer gets for a
//! key out of force or bytes out of range: a refusal that touches nothing and breaks the
//! connection on both sides.
//!
//! An exposed slot is read by the test only once the peer's request has completed at its
//! poster (or the immediate's receive has completed), as `Endpoint::expose` asks.

use tierbuf_pool::{OwnedSlot, SlotPool};
use tierbuf_transport::{
    Access, BufferRef, CompletionStatus, EXPOSURE_SLOTS, Endpoint, EndpointState, Opcode,
    PostError, RemoteBuffer,
};

use super::{
    PATIENCE, SUCCESS, TestProvider, completion, fill_message, fixture, is_message, poll_all,
    poll_for, provider, recv, send,
};

/// The byte every exposed slot starts with, so a stray write shows.
const GUARD: u8 = 0xa5;

fn expose<E: Endpoint>(endpoint: &mut E, slot: &OwnedSlot, access: Access) -> RemoteBuffer {
    // SAFETY: the tests read an exposed slot only after the peer's request completed, and
    // write one exposed for reading only before exposing it.
    unsafe { endpoint.expose(BufferRef::from(slot), access) }.unwrap()
}

fn write<E: Endpoint>(
    endpoint: &mut E,
    gather: &[BufferRef],
    remote: RemoteBuffer,
    imm: Option<u32>,
    wr_id: u64,
) -> Result<(), PostError> {
    // SAFETY: the tests leave posted buffers alone until their completions are polled.
    unsafe { endpoint.post_write(gather, remote, imm, wr_id) }
}

fn read<E: Endpoint>(
    endpoint: &mut E,
    buffer: BufferRef,
    remote: RemoteBuffer,
    wr_id: u64,
) -> Result<(), PostError> {
    // SAFETY: as for `write`.
    unsafe { endpoint.post_read(buffer, remote, wr_id) }
}

/// A slot filled with [`GUARD`].
fn guarded(pool: &SlotPool) -> OwnedSlot {
    let mut slot = pool.try_acquire_owned().unwrap();
    slot.fill(GUARD);
    slot
}

/// A slot holding message `index` in its first `len` bytes.
fn message(pool: &SlotPool, index: u64, len: usize) -> OwnedSlot {
    let mut slot = pool.try_acquire_owned().unwrap();
    fill_message(&mut slot, index, len);
    slot
}

/// Polls `endpoint` until its state is `Broken`, failing past [`PATIENCE`].
fn until_broken<E: Endpoint>(endpoint: &mut E) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while endpoint.state() != EndpointState::Broken {
        let _ = poll_all_or_error(endpoint);
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?} after {PATIENCE:?}",
            endpoint.state()
        );
        std::thread::yield_now();
    }
}

/// Polls once, taking an error as an empty batch: a provider may report the peer's
/// violation from `poll` before it flushes.
fn poll_all_or_error<E: Endpoint>(endpoint: &mut E) -> Vec<tierbuf_transport::Completion> {
    let mut batch = [tierbuf_transport::Completion::default(); 8];
    match endpoint.poll(&mut batch) {
        Ok(n) => batch[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

pub(crate) fn a_write_with_an_immediate_lands_before_its_receive_completes<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 8, 8, 8);
    let window = guarded(&pool);
    let signal = pool.try_acquire_owned().unwrap();
    let remote = expose(&mut target, &window, Access::Write);
    assert_eq!(
        (remote.addr, remote.len),
        (BufferRef::from(&window).addr, 256)
    );
    let pieces = [(0u32, 16u32), (40, 100), (200, 56)];
    for (index, _) in pieces.iter().enumerate() {
        let zero = BufferRef::from(&signal).prefix(0).unwrap();
        recv(&mut target, zero, 100 + index as u64).unwrap();
    }
    let sources: Vec<OwnedSlot> = (0..3)
        .map(|index| message(&pool, index, pieces[index as usize].1 as usize))
        .collect();
    for (index, ((offset, len), source)) in pieces.iter().zip(&sources).enumerate() {
        let at = remote.slice(*offset, *len).unwrap();
        let gather = [BufferRef::from(source).prefix(*len).unwrap()];
        write(
            &mut writer,
            &gather,
            at,
            Some(0x1000 + index as u32),
            index as u64,
        )
        .unwrap();
    }
    let written = poll_for(&mut writer, 3);
    let expected: Vec<_> = (0..3)
        .map(|index| completion(index, 0, SUCCESS, Opcode::Write))
        .collect();
    assert_eq!(written, expected);
    let received = poll_for(&mut target, 3);
    for (index, done) in received.iter().enumerate() {
        let len = pieces[index].1;
        let imm = Opcode::RecvWithImm(0x1000 + index as u32);
        assert_eq!(*done, completion(100 + index as u64, len, SUCCESS, imm));
    }
    let mut at = 0usize;
    for (index, (offset, len)) in pieces.iter().enumerate() {
        let (offset, len) = (*offset as usize, *len as usize);
        assert!(
            window[at..offset].iter().all(|&b| b == GUARD),
            "a stray write"
        );
        assert!(is_message(&window[offset..offset + len], index as u64));
        at = offset + len;
    }
    assert_eq!(target.revoke(remote), Ok(()));
}

pub(crate) fn a_write_without_an_immediate_completes_only_at_the_writer<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Write);
    let source = message(&pool, 7, 256);
    write(&mut writer, &[BufferRef::from(&source)], remote, None, 1).unwrap();
    assert_eq!(
        poll_for(&mut writer, 1),
        [completion(1, 0, SUCCESS, Opcode::Write)]
    );
    assert_eq!(poll_all(&mut target), [], "no completion at the target");
    assert!(is_message(&window[..], 7));
}

pub(crate) fn a_read_copies_the_exposed_range<P: TestProvider>() {
    let (pool, mut reader, mut target) = fixture::<P>(256, 4, 4, 4);
    let exposed = message(&pool, 9, 256);
    let remote = expose(&mut target, &exposed, Access::Read);
    let mut into = pool.try_acquire_owned().unwrap();
    into.fill(0);
    let part = remote.slice(64, 128).unwrap();
    read(
        &mut reader,
        BufferRef::from(&into).prefix(128).unwrap(),
        part,
        3,
    )
    .unwrap();
    assert_eq!(
        poll_for(&mut reader, 1),
        [completion(3, 128, SUCCESS, Opcode::Read)]
    );
    assert_eq!(&into[..128], &exposed[64..192]);
    assert_eq!(poll_all(&mut target), [], "no completion at the target");
}

pub(crate) fn writes_and_reads_complete_in_order_with_the_sends<P: TestProvider>() {
    let (pool, mut a, mut b) = fixture::<P>(256, 8, 8, 8);
    let window = guarded(&pool);
    let readable = message(&pool, 4, 256);
    let to_write = expose(&mut b, &window, Access::Write);
    let to_read = expose(&mut b, &readable, Access::Read);
    let outgoing = message(&pool, 1, 32);
    let written = message(&pool, 2, 256);
    let mut into = pool.try_acquire_owned().unwrap();
    // A send with no receive posted waits, and the write and read behind it wait too.
    send(&mut a, &[BufferRef::from(&outgoing).prefix(32).unwrap()], 1).unwrap();
    write(&mut a, &[BufferRef::from(&written)], to_write, None, 2).unwrap();
    read(&mut a, BufferRef::from(&into), to_read, 3).unwrap();
    assert_eq!(poll_all(&mut a), [], "nothing passes the waiting send");
    let inbox = pool.try_acquire_owned().unwrap();
    recv(&mut b, BufferRef::from(&inbox), 10).unwrap();
    let done = poll_for(&mut a, 3);
    assert_eq!(
        done,
        [
            completion(1, 0, SUCCESS, Opcode::Send),
            completion(2, 0, SUCCESS, Opcode::Write),
            completion(3, 256, SUCCESS, Opcode::Read),
        ]
    );
    assert_eq!(
        poll_for(&mut b, 1),
        [completion(10, 32, SUCCESS, Opcode::Recv)]
    );
    assert!(is_message(&inbox[..32], 1));
    assert!(is_message(&window[..], 2));
    assert!(is_message(&into[..], 4));
    // Writes and reads count in the send queue's depth, and leave it when polled.
    assert_eq!(a.outstanding().sends, 0);
    into.fill(0);
}

pub(crate) fn posting_mistakes_are_refused_at_once<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Write);
    let source = message(&pool, 1, 256);
    let short = BufferRef::from(&source).prefix(255).unwrap();
    assert_eq!(
        write(&mut writer, &[short], remote, None, 1),
        Err(PostError::LengthMismatch {
            local: 255,
            remote: 256
        })
    );
    assert_eq!(
        read(&mut writer, short, remote, 1),
        Err(PostError::LengthMismatch {
            local: 255,
            remote: 256
        })
    );
    let unknown = RemoteBuffer {
        key: remote.key ^ 0x40,
        ..remote
    };
    assert_eq!(
        target.revoke(unknown),
        Err(PostError::UnknownKey {
            remote_key: unknown.key
        })
    );
    assert_eq!(target.revoke(remote), Ok(()));
    assert_eq!(
        target.revoke(remote),
        Err(PostError::UnknownKey {
            remote_key: remote.key
        }),
        "revoked twice"
    );
    assert_eq!(writer.outstanding().sends, 0);
}

pub(crate) fn exposures_past_the_limit_are_refused_until_one_is_revoked<P: TestProvider>() {
    let (pool, _writer, mut target) = fixture::<P>(256, 1, 4, 4);
    let window = pool.try_acquire_owned().unwrap();
    let exposed: Vec<RemoteBuffer> = (0..EXPOSURE_SLOTS)
        .map(|_| expose(&mut target, &window, Access::Write))
        .collect();
    let keys: std::collections::HashSet<u32> = exposed.iter().map(|e| e.key).collect();
    assert_eq!(
        keys.len(),
        EXPOSURE_SLOTS,
        "every exposure has a key of its own"
    );
    // SAFETY: refused, so nothing is exposed.
    let past = unsafe { target.expose(BufferRef::from(&window), Access::Write) };
    assert_eq!(
        past,
        Err(PostError::TooManyExposures {
            max: EXPOSURE_SLOTS
        })
    );
    target.revoke(exposed[5]).unwrap();
    let again = expose(&mut target, &window, Access::Write);
    assert!(
        !keys.contains(&again.key),
        "a revoked key is never given again"
    );
}

/// What a writer's refused request leaves: its completion with a remote access error,
/// the connection broken on both sides, and the target's slot untouched.
fn assert_refused<E: Endpoint>(writer: &mut E, target: &mut E, window: &OwnedSlot, wr_id: u64) {
    let done = poll_for(writer, 1);
    assert_eq!(done[0].wr_id, wr_id);
    assert_eq!(
        done[0].status,
        CompletionStatus::RemoteAccessError,
        "{done:?}"
    );
    assert_eq!(writer.state(), EndpointState::Broken);
    until_broken(target);
    assert!(
        window.iter().all(|&b| b == GUARD),
        "a refused write touched the slot"
    );
}

pub(crate) fn a_revoked_key_is_refused_and_touches_nothing<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Write);
    target.revoke(remote).unwrap();
    let source = message(&pool, 1, 256);
    write(&mut writer, &[BufferRef::from(&source)], remote, None, 1).unwrap();
    assert_refused(&mut writer, &mut target, &window, 1);
}

pub(crate) fn a_write_outside_the_exposed_range_is_refused<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    // SAFETY: as `expose`.
    let remote =
        unsafe { target.expose(BufferRef::from(&window).prefix(128).unwrap(), Access::Write) }
            .unwrap();
    let source = message(&pool, 1, 256);
    let past = RemoteBuffer {
        addr: remote.addr + 64,
        len: 65,
        key: remote.key,
    };
    let gather = [BufferRef::from(&source).prefix(65).unwrap()];
    write(&mut writer, &gather, past, Some(1), 1).unwrap();
    let signal = pool.try_acquire_owned().unwrap();
    recv(&mut target, BufferRef::from(&signal).prefix(0).unwrap(), 9).unwrap();
    assert_refused(&mut writer, &mut target, &window, 1);
}

pub(crate) fn a_read_past_the_advertised_range_is_refused<P: TestProvider>() {
    let (pool, mut reader, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    // SAFETY: as `expose`.
    let remote =
        unsafe { target.expose(BufferRef::from(&window).prefix(64).unwrap(), Access::Read) }
            .unwrap();
    let mut into = pool.try_acquire_owned().unwrap();
    into.fill(0);
    let past = RemoteBuffer { len: 65, ..remote };
    read(
        &mut reader,
        BufferRef::from(&into).prefix(65).unwrap(),
        past,
        1,
    )
    .unwrap();
    let done = poll_for(&mut reader, 1);
    assert_eq!(
        done[0].status,
        CompletionStatus::RemoteAccessError,
        "{done:?}"
    );
    assert!(
        into[..65].iter().all(|&b| b == 0),
        "a refused read delivered bytes"
    );
    until_broken(&mut target);
}

pub(crate) fn an_exposure_for_reads_refuses_writes<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Read);
    let source = message(&pool, 1, 256);
    write(&mut writer, &[BufferRef::from(&source)], remote, None, 1).unwrap();
    assert_refused(&mut writer, &mut target, &window, 1);
}

pub(crate) fn another_connections_key_is_refused<P: TestProvider>() {
    let provider = provider::<P>();
    let pool = super::pool(&provider, 256, 4);
    let (_writer, mut target) = provider.connect_pair(4, 4);
    let (mut stranger, mut its_target) = provider.connect_pair(4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Write);
    let source = message(&pool, 1, 256);
    write(&mut stranger, &[BufferRef::from(&source)], remote, None, 1).unwrap();
    assert_refused(&mut stranger, &mut its_target, &window, 1);
    assert_eq!(
        target.state(),
        EndpointState::Open,
        "the exposing connection stands"
    );
}

pub(crate) fn closing_flushes_waiting_writes_and_keeps_exposed_bytes<P: TestProvider>() {
    let (pool, mut writer, mut target) = fixture::<P>(256, 4, 4, 4);
    let window = guarded(&pool);
    let remote = expose(&mut target, &window, Access::Write);
    let source = message(&pool, 1, 256);
    // No receive for the immediate: the write waits, and the close flushes it.
    write(&mut writer, &[BufferRef::from(&source)], remote, Some(5), 1).unwrap();
    target.close();
    let done = poll_for(&mut writer, 1);
    assert_eq!(done[0].wr_id, 1);
    assert_eq!(done[0].opcode, Opcode::Write);
    assert_ne!(done[0].status, SUCCESS, "{done:?}");
    assert!(window.iter().all(|&b| b == GUARD));
}
