//! What the first message of a fresh shm pair pays beyond a message on a warm one: its
//! time and the page faults taken while it travels, for `PAIRS` fresh pairs of one
//! provider and reservoir, as `transport/promotion/first_fitting/shm` and
//! `first_oversize/shm` build them.
//!
//! `cargo run --release -p tierbuf-benches --example first_message -- SHAPE PAIRS
//! [idle]`: `SHAPE` `fitting` (the bench ladder's 8 KiB tier and up, so the 8 KiB message
//! goes whole), `oversize` (the whole bench ladder, so it goes in segments on tier 0
//! while the promotion is asked for) or `small` (the whole bench ladder, a 64-byte
//! message, which travels inline in the ring entry); with `idle`, both connections run 600 idle
//! `progress` calls before the message, enough for each endpoint to look at its socket
//! and map the receive regions its peer announced, which otherwise happens inside the
//! first send. Each line: the message's time, from `try_send` to its delivery, and the
//! minor page faults of the process meanwhile (`getrusage`). Run it under `strace -f` to
//! see the system calls a first message makes. See `docs/transport.md`, "What a fresh
//! shm pair's first message pays".

use std::sync::Arc;
use std::time::Instant;

use tierbuf_benches::connect;
use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{ConnectionConfig, SendError};
use tierbuf_transport::{Provider, ShmProvider};

/// The message, as `transport/promotion` sends it.
const SIZE: usize = 8192;

/// The message of shape `small`, as `transport/pingpong/shm/64` sends it.
const SMALL: usize = 64;

/// Idle progress calls made before the message with `idle`: past the endpoint's 256 idle
/// polls between two looks at its socket.
const IDLE_CALLS: usize = 600;

fn main() {
    let mut args = std::env::args().skip(1);
    let shape = args.next().expect("a shape: fitting, oversize or small");
    let pairs: usize = args.next().map_or(20, |n| n.parse().expect("a count"));
    let idle = args.next().as_deref() == Some("idle");
    // The bench ladder (`benches/benches/transport.rs`), or its tiers from 8 KiB up.
    let mut builder = TierLadder::builder();
    let (whole_ladder, size) = match shape.as_str() {
        "oversize" => (true, SIZE),
        "small" => (true, SMALL),
        "fitting" => (false, SIZE),
        other => panic!("unknown shape {other}: fitting, oversize or small"),
    };
    if whole_ladder {
        builder = builder.tier(512, 16, 480);
    }
    let ladder = builder
        .tier(8192, 16, 8192)
        .tier(65536, 8, 65536)
        .reservoir_regions(4)
        .build()
        .expect("a valid ladder");
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 30));
    let config = Arc::new(ConnectionConfig::new(Arc::new(ladder)).expect("a config"));
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    let message = vec![7u8; size];
    for _ in 0..pairs {
        reservoir.fill().expect("refill the reservoir");
        let (a, b) = provider.pair(64, 64).expect("a shm pair");
        let (mut a, mut b) = (
            connect(&config, &reservoir, a),
            connect(&config, &reservoir, b),
        );
        if idle {
            for _ in 0..IDLE_CALLS {
                a.progress().expect("progress");
                b.progress().expect("progress");
            }
        }
        let faults = minor_faults();
        let start = Instant::now();
        loop {
            match a.try_send(&message) {
                Ok(_) => break,
                Err(SendError::WouldBlock(_)) => {
                    a.progress().expect("progress");
                    b.progress().expect("progress");
                }
                Err(error) => panic!("send failed: {error}"),
            }
        }
        let received = loop {
            a.progress().expect("progress");
            if let Some(received) = b.try_recv().expect("receive") {
                break received;
            }
        };
        let elapsed = start.elapsed();
        let faults = minor_faults() - faults;
        assert!(received[..] == message[..], "the message came whole");
        println!("{shape}: {elapsed:?}, {faults} minor page faults");
    }
}

/// The process's minor page faults so far.
fn minor_faults() -> i64 {
    // SAFETY: `getrusage` writes the whole struct it is given, which all-zero bytes
    // already make a valid value of.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_minflt
}
