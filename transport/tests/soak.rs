//! Soak: many loopback connections promoting and demoting under a tight budget while
//! peers die at random, for a bounded time. What must hold throughout and after:
//!
//! - the budget's cap is never passed (its high-water mark says so), and refusals show in
//!   the connections' stats;
//! - every message accepted by a live pair arrives whole and in order;
//! - a side whose peer died reports it as the peer's fault, never hangs;
//! - once everything is dropped the budget is back to zero, and the process's resident
//!   anonymous memory within 10 % of what it was after a first round of the same size
//!   and the same steps (the allocator keeps its high-water heap; what a second round
//!   that replays the first adds is a leak).
//!
//! `TIERBUF_SOAK_PAIRS` (default 20 000), `TIERBUF_SOAK_SECS` (default 10) and
//! `TIERBUF_SOAK_SEED` size and seed the large one.

mod traffic;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionCore, ConnectionStats, Fault, SendError,
};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider, Provider};
use traffic::pattern;

type Side = Connection<LoopbackEndpoint>;

/// Receives and sends each side keeps posted at most.
const DEPTH: u32 = 8;

/// How much more heap may be in use after the soak than after its first round: what
/// lazily made statics take, far below what a leak of one small allocation per
/// connection takes.
const LIVE_HEAP_SLACK: usize = 256 << 10;

/// How much more anonymous memory may be resident after the soak than after its first
/// round, beyond 10 %: with the mmap threshold fixed ([`fix_mmap_threshold`]) the second
/// round kept at most 66 KB more than the first in twelve soaks here, run while two other
/// processes kept both cores busy, but one soak of 500 pairs in a CI run kept 1.16 MB
/// more with the heap in use unchanged (238 288 bytes against 231 056; not reproduced in
/// 18 runs since, its cause not found). A leak of one page a pair passes this on the
/// 500-pair soaks; the 20 000-pair soak still shows it (80 MB), and the heap-in-use check
/// shows a leak of a few bytes a connection on either.
const RESIDENT_SLACK: u64 = 2 << 20;

/// Drive passes a live pair gets to deliver one message before the soak calls it stuck.
const PASSES: usize = 100_000;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|value| value.parse().unwrap_or_else(|_| panic!("{name}={value:?}")))
        .unwrap_or(default)
}

/// Three tiers whose regions are 1 KiB (charged a 4 KiB page), 16 KiB and 48 KiB; tiers
/// step down after 20 ms idle, and nothing is kept in reserve, so every region given
/// back is deregistered at once.
fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(256, 4, 240)
            .tier(4096, 4, 4080)
            .tier(16_384, 3, 16_368)
            .demote_after(Duration::from_millis(20))
            .hysteresis(Duration::from_millis(5))
            .reservoir_regions(0)
            .build()
            .unwrap(),
    )
}

/// The soak's connections and the numbers it keeps.
struct Soak {
    provider: LoopbackProvider,
    config: Arc<ConnectionConfig>,
    reservoir: Arc<Reservoir>,
    pairs: Vec<Option<(Side, Side)>>,
    rng: u64,
    seed: u64,
    /// Stats of sides dropped so far, summed.
    retired: Totals,
    delivered: u64,
    deaths: u64,
    refused_connections: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    promotions: u64,
    demotions: u64,
    refusals: u64,
    held_back: u64,
}

impl Totals {
    fn add(&mut self, stats: ConnectionStats) {
        self.promotions += stats.tiers.promotions;
        self.demotions += stats.tiers.demotions;
        self.refusals +=
            stats.tiers.nacks + stats.tiers.send_buffers_refused + stats.tiers.recv_buffers_refused;
        self.held_back += stats.tiers.held_back_by_refusal;
    }
}

impl Soak {
    fn new(budget: &MemoryBudget, pairs: usize, seed: u64) -> Soak {
        let provider = LoopbackProvider::new(budget.clone());
        let config = Arc::new(ConnectionConfig::new(ladder()).unwrap());
        let reservoir = Arc::new(Reservoir::new(
            provider.registrar(),
            Arc::clone(config.ladder()),
        ));
        let mut soak = Soak {
            provider,
            config,
            reservoir,
            pairs: Vec::with_capacity(pairs),
            rng: seed | 1,
            seed: 0,
            retired: Totals::default(),
            delivered: 0,
            deaths: 0,
            refused_connections: 0,
        };
        for _ in 0..pairs {
            let pair = soak.connect();
            soak.pairs.push(pair);
        }
        soak
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// A new pair on tier 0, or `None` when the budget refuses its first buffers.
    fn connect(&mut self) -> Option<(Side, Side)> {
        let (a, b) = self.provider.pair(DEPTH, DEPTH).unwrap();
        let side = |endpoint| {
            let core = ConnectionCore::new(
                Arc::clone(&self.config),
                Arc::clone(&self.reservoir),
                Arc::clone(&self.reservoir),
                Instant::now(),
            )
            .ok()?;
            Connection::new(core, endpoint).ok()
        };
        match (side(a), side(b)) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => {
                self.refused_connections += 1;
                None
            }
        }
    }

    /// One step on a random pair: a message one way or the other, or one side's death.
    fn step(&mut self) {
        let index = (self.next() % self.pairs.len() as u64) as usize;
        let roll = self.next();
        let Some((mut a, mut b)) = self.pairs[index].take() else {
            self.pairs[index] = self.connect();
            return;
        };
        if roll % 2 == 1 {
            std::mem::swap(&mut a, &mut b);
        }
        if roll % 100 < 2 {
            self.kill(a, b, roll);
            self.pairs[index] = self.connect();
            return;
        }
        let len = match (roll >> 8) % 10 {
            0 => 4096 + (roll >> 16) as usize % 40_000,
            1..=2 => (roll >> 16) as usize % 4096,
            _ => (roll >> 16) as usize % 240,
        };
        self.seed += 1;
        let message = pattern(len, self.seed);
        deliver(&mut a, &mut b, &message);
        self.delivered += 1;
        self.pairs[index] = Some((a, b));
    }

    /// Starts a large message from `a` (so a promotion may be under way), drops `b`, and
    /// drives `a` until it reports the death as its peer's doing.
    fn kill(&mut self, mut a: Side, b: Side, roll: u64) {
        self.seed += 1;
        let large = pattern(5000 + (roll >> 20) as usize % 20_000, self.seed);
        let _ = a.try_send(&large);
        self.retired.add(b.stats());
        drop(b);
        let error = (0..PASSES)
            .find_map(|_| a.progress().err())
            .expect("the death of the peer was never reported");
        assert_eq!(error.fault(), Fault::Peer, "{error:?}");
        self.retired.add(a.stats());
        self.deaths += 1;
    }

    fn totals(&self) -> Totals {
        let mut totals = self.retired;
        for (a, b) in self.pairs.iter().flatten() {
            totals.add(a.stats());
            totals.add(b.stats());
        }
        totals
    }
}

/// Sends `message` from `a` and drives both sides until `b` has it, checking it.
fn deliver(a: &mut Side, b: &mut Side, message: &[u8]) {
    for _ in 0..PASSES {
        match a.try_send(message) {
            Ok(()) => {
                for _ in 0..PASSES {
                    a.progress().unwrap();
                    if let Some(received) = b.try_recv().unwrap() {
                        assert_eq!(&received[..], message, "delivered whole");
                        return;
                    }
                }
                panic!("a message of {} bytes was never delivered", message.len());
            }
            Err(SendError::WouldBlock(_)) => {
                a.progress().unwrap();
                b.progress().unwrap();
            }
            Err(error) => panic!("send failed: {error}"),
        }
    }
    panic!(
        "a message of {} bytes was never accepted ({:?}): sender {:?}, receiver {:?}",
        message.len(),
        a.try_send(message).err(),
        a.stats(),
        b.stats()
    );
}

/// Anonymous resident memory of this process (heap, stacks, mappings of its own; not the
/// pages of its code, which a soak touches more of than a warm-up), in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("RssAnon:"))
        .expect("RssAnon in /proc/self/status");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Gives the C allocator's free memory back to the system, so that resident memory
/// measures what is still allocated.
/// Fixes glibc's mmap threshold at its default, which also stops the allocator moving it.
/// Left free, it rises the first time a block served by `mmap` is freed, so the first
/// round of the first soak in a process serves its large blocks from fresh mappings (given
/// back whole when freed) and the second from the heap (kept, fragmented): resident memory
/// grew by 1.4–4.0 MB between the two rounds of the first soak only, with the heap in use
/// unchanged.
fn fix_mmap_threshold() {
    // SAFETY: `mallopt` only changes the allocator's settings.
    let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
    assert_eq!(set, 1, "mallopt(M_MMAP_THRESHOLD) refused");
}

fn trim_heap() {
    // SAFETY: `malloc_trim` only returns free heap memory to the system.
    unsafe { libc::malloc_trim(0) };
}

#[test]
fn many_connections_under_a_tight_budget_with_dying_peers() {
    soak(
        setting("TIERBUF_SOAK_PAIRS", 20_000) as usize,
        Duration::from_secs(setting("TIERBUF_SOAK_SECS", 10)),
        setting("TIERBUF_SOAK_SEED", 0x9E37_79B9_7F4A_7C15),
    );
}

/// Five hundred pairs compete for room for a few hundred promotions: demotions are
/// refused, and a connection's pending demotion meets messages that need the tier it is
/// leaving, at every turn. Each seed stalled a connection before a pending demotion
/// stopped being superseded by a promotion, and a refused demotion stopped being asked
/// again at every pass.
#[test]
fn a_few_hundred_connections_competing_for_promotions_never_stall() {
    for seed in 1..=4 {
        soak(500, Duration::from_millis(1500), seed);
    }
}

/// Runs `pairs` connected pairs from `seed` for about `duration`: a first round for half of
/// it, then a second of as many steps; one soak at a time in this process, since each
/// measures the process's memory.
fn soak(pairs: usize, duration: Duration, seed: u64) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    fix_mmap_threshold();
    // Tier 0 for every pair (four regions of one page each) and room for a few hundred
    // promotions besides: most promotions are refused at the busiest moments.
    let page = tierbuf_pool::page_size() as u64;
    let cap = pairs as u64 * 4 * page + (8 << 20);
    let budget = MemoryBudget::with_cap(cap);
    // A first round of the same size, so that what the process keeps once it has held
    // this many connections (the allocator's high-water heap, lazily made statics) is in
    // the figure resident memory must come back to: what the second round leaves beyond
    // it is what the connections leak.
    let mut first = Soak::new(&budget, pairs, seed);
    let start = Instant::now();
    let mut first_steps = 0u64;
    while start.elapsed() < duration / 2 {
        first.step();
        first_steps += 1;
    }
    drop(first);
    assert_eq!(
        budget.in_use(),
        0,
        "every registered byte came back after round one"
    );
    trim_heap();
    let resident_before = resident_bytes();
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let live_before = unsafe { libc::mallinfo2() }.uordblks;

    // The second round replays the first step for step from the same seed: the same
    // messages, deaths and new connections in the same order (only the tier decisions
    // that timers make can differ). So what it keeps beyond the first round's memory is
    // not the high-water mark of a longer round, nor of a round that a loaded machine cut
    // short the first time.
    let mut soak = Soak::new(&budget, pairs, seed);
    let start = Instant::now();
    let mut steps = 0u64;
    while steps < first_steps {
        soak.step();
        steps += 1;
    }
    // The budget's high-water mark counts every registration of both rounds, also those
    // made and given back within a step.
    let peak = budget.peak();
    assert!(peak <= cap, "the cap was passed: {peak} of {cap} bytes");
    let totals = soak.totals();
    println!(
        "{pairs} pairs, {steps} steps in {:?}: {} messages, {} deaths, {} connections \
         refused, peak {peak} of {cap} bytes, {totals:?}",
        start.elapsed(),
        soak.delivered,
        soak.deaths,
        soak.refused_connections
    );
    assert!(
        soak.deaths > 0 && soak.delivered > 0,
        "the soak did something"
    );
    assert!(totals.promotions > 0, "{totals:?}");
    assert!(
        totals.refusals > 0,
        "a budget this tight refuses promotions, and the stats say so: {totals:?}"
    );

    drop(soak);
    assert_eq!(budget.in_use(), 0, "every registered byte came back");
    trim_heap();
    let resident_after = resident_bytes();
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let live_after = unsafe { libc::mallinfo2() }.uordblks;
    println!(
        "live heap {live_after} bytes (after round one {live_before}), resident \
         {resident_after} bytes (after round one {resident_before})"
    );
    // What the allocator still holds in use: a leak of a few bytes a connection shows
    // here at once (20 000 pairs of 64 bytes: 2.5 MB).
    assert!(
        live_after <= live_before + LIVE_HEAP_SLACK,
        "heap in use {live_after} bytes, {live_before} after round one"
    );
    // Resident memory within 10 % of round one's, or within the slack the allocator's
    // retention of heap pages takes on a baseline of a few megabytes.
    let bound = (resident_before + resident_before / 10).max(resident_before + RESIDENT_SLACK);
    assert!(
        resident_after <= bound,
        "resident memory {resident_after} bytes, {resident_before} after round one"
    );
}
