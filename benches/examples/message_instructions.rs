//! The work one message costs on each layer of the shm transport, with no waiting in it:
//! both ends of an shm pair (`ShmProvider::pair`) in this one thread, so every receive
//! finds its message already delivered and no loop spins. Run it under
//! `valgrind --tool=callgrind` (or any instruction counter) twice, with `ROUNDS` and
//! with 0, and divide the difference by `2 × ROUNDS` for the instructions one message
//! costs its sender and its receiver together; callgrind's per-function counts say where
//! they go. The same round trips as `transport/pingpong_endpoint` (mode `endpoint`),
//! `transport/pingpong` (`spot`: four places of each message checked) and
//! `transport/pingpong_consumed` (`whole`: every word summed), less the peer process;
//! `segmented` is `spot` on the bench ladder's tier 0 alone, where a message past 480
//! bytes travels in segments every time, as in `transport/promotion/segmented`;
//! `spot-loopback` and `segmented-loopback` are `spot` and `segmented` over a loopback
//! pair (the provider of `transport/promotion/*/loopback`);
//! `stream` sends batches of eight messages one way, as `transport/stream` sends them,
//! each batch taken whole on the other side (`ROUNDS` counts batches there, so divide by
//! `8 × ROUNDS` for a message); `batched` sends batches of 64 with one `try_send_batch`
//! each, as `transport/stream/shm_batched` sends them (small messages share packed
//! frames), each batch taken whole on the other side (divide by `64 × ROUNDS`); `sum`
//! times the benches' word sum alone; `frames-loopback` and `frames-shm` are the floor
//! of a segmented message under any connection layer: the provider alone carrying a
//! `SIZE`-byte message one way in frames of a tier-0 slot (512 bytes, 496 of them
//! payload), from registered slots already holding the bytes into posted receives, each
//! completion reaped and its receive posted again, nothing copied out; and
//! `whole-frame-loopback` and `whole-frame-shm` the same message in one frame. It prints the
//! time a round trip (a batch, a sum) took, which is only worth comparing between runs
//! made in the same minutes.
//!
//! `cargo build --profile bench -p tierbuf-benches --example message_instructions`, then
//! `valgrind --tool=callgrind target/release/examples/message_instructions MODE ROUNDS
//! SIZE`, `MODE` one of `endpoint`, `spot`, `whole`, `segmented`, `spot-loopback`,
//! `segmented-loopback`, `frames-loopback`, `frames-shm`, `whole-frame-loopback`,
//! `whole-frame-shm`, `stream`, `batched`, `sum`;
//! `SIZE` in bytes,
//! 64 unless given. See `docs/transport.md`, "What the consumed figures are made of".

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_benches::connect;
use tierbuf_benches::messages::{Reading, check, message, rest_sum, word_sum};
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, HEADER_LEN, Message, SendError};
use tierbuf_transport::{
    BufferRef, Completion, Endpoint, LoopbackProvider, Opcode, Provider, QueueKind, ShmProvider,
};

const DEPTH: u32 = 64;

/// Round trips made before the timed ones (and before the counted ones, if the run with 0
/// rounds is subtracted), so both connections are on the tier of the message.
const WARM: u64 = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .expect("a mode: endpoint, spot, whole, segmented, spot-loopback, segmented-loopback, stream, batched or sum");
    let rounds: u64 = args.next().map_or(100_000, |n| n.parse().expect("a count"));
    let size: usize = args.next().map_or(64, |n| n.parse().expect("a size"));
    let (elapsed, round) = match mode.as_str() {
        "endpoint" => (endpoint(rounds, size), "a round trip"),
        "spot" => (connection(rounds, size, false, false), "a round trip"),
        "whole" => (connection(rounds, size, true, false), "a round trip"),
        "segmented" => (connection(rounds, size, false, true), "a round trip"),
        "spot-loopback" => (connection_loopback(rounds, size, false), "a round trip"),
        "segmented-loopback" => (connection_loopback(rounds, size, true), "a round trip"),
        "frames-loopback" | "frames-shm" | "whole-frame-loopback" | "whole-frame-shm" => {
            let frame = if mode.starts_with("frames") {
                SEGMENT_FRAME
            } else {
                size + HEADER_LEN
            };
            let elapsed = if mode.ends_with("loopback") {
                let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 30));
                let pair = provider.pair(DEPTH, DEPTH).expect("a loopback pair");
                frames(&provider, pair, rounds, size, frame)
            } else {
                let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 30));
                let pair = provider.pair(DEPTH, DEPTH).expect("an shm pair");
                frames(&provider, pair, rounds, size, frame)
            };
            (elapsed, "a message, one way")
        }
        "stream" => (stream(rounds, size), "a batch of 8"),
        "batched" => (batched(rounds, size), "a batch of 64"),
        "sum" => {
            let bytes = message(size);
            let mut total = 0u64;
            let start = Instant::now();
            for _ in 0..rounds {
                total = total.wrapping_add(word_sum(std::hint::black_box(&bytes)));
            }
            let elapsed = start.elapsed();
            println!(
                "word_sum of {size} B: {:.3} ns, {:.2} bytes/ns ({total})",
                elapsed.as_nanos() as f64 / rounds as f64,
                (size as u64 * rounds) as f64 / elapsed.as_nanos() as f64
            );
            return;
        }
        other => panic!("unknown mode {other}"),
    };
    println!(
        "{mode} {size} B: {:.1} ns {round}, both sides in one thread",
        elapsed.as_nanos() as f64 / rounds.max(1) as f64
    );
}

/// Two connections over one shm pair, on the bench ladder or on its tier 0 alone.
fn connection_pair(tier_0_alone: bool) -> (Shm, Shm) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 30));
    connection_pair_over(&provider, tier_0_alone, |depth| {
        provider.pair(depth, depth).expect("an shm pair")
    })
}

/// Two connections over one pair of `provider`'s endpoints (`pair` makes them), on the
/// bench ladder or on its tier 0 alone.
fn connection_pair_over<E: Endpoint>(
    provider: &impl Provider,
    tier_0_alone: bool,
    pair: impl FnOnce(u32) -> (E, E),
) -> (Connection<E>, Connection<E>) {
    let mut ladder = TierLadder::builder().tier(512, 16, 480);
    if !tier_0_alone {
        ladder = ladder.tier(8192, 16, 8192).tier(65536, 8, 65536);
    }
    let ladder = Arc::new(ladder.build().expect("a ladder"));
    let config = Arc::new(ConnectionConfig::new(ladder).expect("a config"));
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    reservoir.fill().expect("register the spares");
    let (a, b) = pair(DEPTH);
    (
        connect(&config, &reservoir, a),
        connect(&config, &reservoir, b),
    )
}

/// `rounds` round trips between two connections over one shm pair, as
/// `transport/pingpong` runs them: on the bench ladder, or on its tier 0 alone; the
/// receiver reads every word (`whole`) or four places.
fn connection(rounds: u64, size: usize, whole: bool, tier_0_alone: bool) -> Duration {
    let (a, b) = connection_pair(tier_0_alone);
    round_trips(a, b, rounds, size, whole)
}

/// [`connection`] over a loopback pair: `spot-loopback` and `segmented-loopback`, as
/// `transport/promotion/{already_promoted,segmented}/loopback` send an 8 KiB message.
fn connection_loopback(rounds: u64, size: usize, tier_0_alone: bool) -> Duration {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 30));
    let (a, b) = connection_pair_over(&provider, tier_0_alone, |depth| {
        provider.pair(depth, depth).expect("a loopback pair")
    });
    round_trips(a, b, rounds, size, false)
}

/// `rounds` round trips of a `size`-byte message between `a` and `b`.
fn round_trips<E: Endpoint>(
    mut a: Connection<E>,
    mut b: Connection<E>,
    rounds: u64,
    size: usize,
    whole: bool,
) -> Duration {
    let expected = message(size);
    let rest = rest_sum(&expected);
    let reading = if whole { Reading::Whole } else { Reading::Spot };
    let mut outgoing = expected.clone();
    let mut start = Instant::now();
    for seq in 0..WARM + rounds {
        if seq == WARM {
            start = Instant::now();
        }
        outgoing[..8].copy_from_slice(&seq.to_le_bytes());
        send(&mut a, &mut b, &outgoing);
        let received = recv(&mut b, &mut a);
        reading.check(&received, seq, &expected, rest);
        send(&mut b, &mut a, &received);
        drop(received);
        reading.check(&recv(&mut a, &mut b), seq, &expected, rest);
    }
    start.elapsed()
}

/// The bench ladder's tier-0 slot: the frame of a segmented message.
const SEGMENT_FRAME: usize = 512;

/// `rounds` messages of `size` bytes one way from `a` to `b`, each in frames of at most
/// `frame` bytes (payload and a header's room), by the provider alone: every frame sent
/// from a registered slot that already holds it into a receive of `frame` bytes posted
/// beforehand, every completion reaped on both sides and every receive posted again.
fn frames<E: Endpoint>(
    provider: &impl Provider,
    (mut a, mut b): (E, E),
    rounds: u64,
    size: usize,
    frame: usize,
) -> Duration {
    let count = size.div_ceil(frame - HEADER_LEN);
    assert!(count <= DEPTH as usize, "a message's frames fit the queues");
    let registrar = provider.registrar();
    let sends = SlotPool::new(&*registrar, frame, count).expect("send slots");
    let receives = SlotPool::new(&*registrar, frame, count).expect("receive slots");
    let outgoing: Vec<OwnedSlot> = (0..count)
        .map(|_| {
            let mut slot = sends.try_acquire_owned().expect("a send slot");
            slot.fill(7);
            slot
        })
        .collect();
    let inbox: Vec<OwnedSlot> = (0..count)
        .map(|_| receives.try_acquire_owned().expect("a receive slot"))
        .collect();
    for (at, slot) in inbox.iter().enumerate() {
        // SAFETY: a receive slot is read only after its completion, and posted again only
        // after that.
        unsafe { b.post_recv(BufferRef::from(slot), at as u64) }.expect("post");
    }
    let mut completions = [Completion::default(); 64];
    let mut start = Instant::now();
    for round in 0..WARM + rounds {
        if round == WARM {
            start = Instant::now();
        }
        let mut left = size;
        for (at, slot) in outgoing.iter().enumerate() {
            let len = (left.min(frame - HEADER_LEN) + HEADER_LEN) as u32;
            left = left.saturating_sub(frame - HEADER_LEN);
            let part = BufferRef::from(slot).prefix(len).expect("within");
            // SAFETY: the send slots are never written while sends are posted.
            unsafe { a.post_send(&[part], at as u64) }.expect("send");
        }
        let (mut sent, mut received, mut bytes) = (0, 0, 0);
        while sent < count || received < count {
            let ready = b.poll(&mut completions).expect("poll");
            for done in &completions[..ready] {
                assert!(done.status.is_success() && done.opcode == Opcode::Recv);
                received += 1;
                bytes += done.byte_len as usize;
                let slot = &inbox[done.wr_id as usize];
                // SAFETY: as above.
                unsafe { b.post_recv(BufferRef::from(slot), done.wr_id) }.expect("post");
            }
            let ready = a.poll(&mut completions).expect("poll");
            for done in &completions[..ready] {
                assert!(done.status.is_success() && done.opcode == Opcode::Send);
                sent += 1;
            }
        }
        assert_eq!(bytes, size + count * HEADER_LEN, "every byte delivered");
    }
    start.elapsed()
}

/// Messages a side of `stream` sends before the other takes them: half the bench
/// ladder's tier-0 credits, so the sender never waits for a grant within a batch.
const STREAM_BATCH: u64 = 8;

/// `rounds` batches of [`STREAM_BATCH`] messages one way, as `transport/stream` sends
/// them: one side sends a batch, the other then takes it, checking four places of each.
/// A message's count is the instructions of one message sent and received in a stream,
/// the grants the receiver sends back included; `ROUNDS` counts batches here.
fn stream(rounds: u64, size: usize) -> Duration {
    let (mut a, mut b) = connection_pair(false);
    let expected = message(size);
    let rest = rest_sum(&expected);
    let mut outgoing = expected.clone();
    let mut seq = 0;
    let mut start = Instant::now();
    for round in 0..WARM + rounds {
        if round == WARM {
            start = Instant::now();
        }
        for at in seq..seq + STREAM_BATCH {
            outgoing[..8].copy_from_slice(&at.to_le_bytes());
            send(&mut a, &mut b, &outgoing);
        }
        for at in seq..seq + STREAM_BATCH {
            Reading::Spot.check(&recv(&mut b, &mut a), at, &expected, rest);
        }
        seq += STREAM_BATCH;
    }
    start.elapsed()
}

/// Messages a `batched` round sends with one `try_send_batch` call after another.
const BATCH_WINDOW: u64 = 64;

/// `rounds` batches of [`BATCH_WINDOW`] messages one way, as
/// `transport/stream/shm_batched` sends them, each taken whole on the other side.
fn batched(rounds: u64, size: usize) -> Duration {
    let (mut a, mut b) = connection_pair(false);
    let expected = message(size);
    let rest = rest_sum(&expected);
    let mut window = vec![expected.clone(); BATCH_WINDOW as usize];
    let mut seq: u64 = 0;
    let mut start = Instant::now();
    for round in 0..WARM + rounds {
        if round == WARM {
            start = Instant::now();
        }
        for (message, at) in window.iter_mut().zip(seq..) {
            message[..8].copy_from_slice(&at.to_le_bytes());
        }
        let batch: Vec<&[u8]> = window.iter().map(Vec::as_slice).collect();
        let mut sent = 0;
        while sent < batch.len() {
            match a.try_send_batch(&batch[sent..]) {
                Ok(taken) => sent += taken,
                Err(SendError::WouldBlock(_)) => b.progress().expect("progress"),
                Err(error) => panic!("send failed: {error}"),
            }
            a.progress().expect("progress");
        }
        for at in seq..seq + BATCH_WINDOW {
            Reading::Spot.check(&recv(&mut b, &mut a), at, &expected, rest);
        }
        seq += BATCH_WINDOW;
    }
    start.elapsed()
}

type Shm = Connection<tierbuf_transport::ShmEndpoint>;

/// Sends `message` on `from` whole, driving `to` while `from` waits for credit (this
/// thread is both sides).
fn send<E: Endpoint>(from: &mut Connection<E>, to: &mut Connection<E>, message: &[u8]) {
    loop {
        match from.try_send(message) {
            Ok(()) => return,
            Err(SendError::WouldBlock(_)) => to.progress().expect("progress"),
            Err(error) => panic!("send failed: {error}"),
        }
        from.progress().expect("progress");
    }
}

/// The next message on `on`, driving `from` too until it has come.
fn recv<E: Endpoint>(on: &mut Connection<E>, from: &mut Connection<E>) -> Message {
    loop {
        if let Some(message) = on.try_recv().expect("receive") {
            return message;
        }
        from.progress().expect("progress");
    }
}

/// `rounds` round trips between two shm endpoints, as `transport/pingpong_endpoint`
/// runs them: a ping from a registered slot, echoed from the buffer it arrived in.
fn endpoint(rounds: u64, size: usize) -> Duration {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 30));
    // A region receives for one peer only: each side's inbox from a pool of its own.
    let pools: Vec<SlotPool> = (0..3)
        .map(|_| SlotPool::new(&*provider.registrar(), size, 1).expect("a slot pool"))
        .collect();
    let mut slots = pools
        .iter()
        .map(|pool| pool.try_acquire_owned().expect("a slot"));
    let (mut a, mut b) = provider.pair(DEPTH, DEPTH).expect("an shm pair");
    let expected = message(size);
    let mut ping: OwnedSlot = slots.next().expect("a slot");
    ping.copy_from_slice(&expected);
    let (a_inbox, b_inbox) = (slots.next().expect("a slot"), slots.next().expect("a slot"));
    // SAFETY: each inbox is read only once its completion has been polled.
    unsafe {
        a.post_recv(BufferRef::from(&a_inbox), 0).expect("post");
        b.post_recv(BufferRef::from(&b_inbox), 0).expect("post");
    }
    let mut completions = [Completion::default(); 4];
    // Polls `endpoint` until it has seen a send's completion (if `send`) and a receive's
    // (if `recv`); returns the receive's length.
    let mut wait = |endpoint: &mut tierbuf_transport::ShmEndpoint, send: bool, recv: bool| {
        let (mut sent, mut received) = (!send, None);
        while !sent || (recv && received.is_none()) {
            let ready = endpoint.poll(&mut completions).expect("poll");
            for done in &completions[..ready] {
                assert!(done.status.is_success());
                match done.opcode.queue() {
                    QueueKind::Send => sent = true,
                    QueueKind::Recv => received = Some(done.byte_len as usize),
                }
            }
        }
        received.unwrap_or(0)
    };
    let mut start = Instant::now();
    for seq in 0..WARM + rounds {
        if seq == WARM {
            start = Instant::now();
        }
        ping[..8].copy_from_slice(&seq.to_le_bytes());
        // SAFETY: the ping is written again only after this send's completion.
        unsafe { a.post_send(&[BufferRef::from(&ping)], 1) }.expect("ping");
        let len = wait(&mut b, false, true);
        check(&b_inbox[..len], seq, &expected);
        let echo = BufferRef::from(&b_inbox)
            .prefix(len as u32)
            .expect("within");
        // SAFETY: the inbox is posted again only after this send's completion.
        unsafe { b.post_send(&[echo], 1) }.expect("echo");
        wait(&mut b, true, false);
        // SAFETY: as above.
        unsafe { b.post_recv(BufferRef::from(&b_inbox), 0) }.expect("post");
        let len = wait(&mut a, true, true);
        check(&a_inbox[..len], seq, &expected);
        // SAFETY: as above.
        unsafe { a.post_recv(BufferRef::from(&a_inbox), 0) }.expect("post");
    }
    start.elapsed()
}
