//! Requests and replies both ways on the `storage` ladder, two to four requests in flight
//! per side, messages from 512 B to 4 MiB: every message must arrive, byte for byte,
//! without a stretch in which no data moves while the two sides trade credit-only frames.
//! Such a stretch lasts until one side demotes its send tier, `demote_after` (60 s on this
//! ladder) after its last large message.
//!
//! Two `ConnectionCore`s on the test pair (`transport/src/test_pair.rs`), its frames
//! moving as soon as they are posted, as the loopback provider moves them, with a clock
//! that moves 1 ms per round. Each side is driven as `Connection` drives a core: a
//! progress pass runs the core, takes the completions ready (running the core again after
//! each one that leaves a credit frame owed) and runs the core once more after them; and
//! a message is sent as `Connection::send` sends it, offering the rest of it until all is
//! posted, with a progress pass after each offer (over a provider that copies no frame
//! from the caller's memory, as the loopback one, that is `try_send_some`). Each side
//! checks every delivered message against the message the peer sent and answers each
//! request with a reply.
//!
//! Each exchange runs with the completions taken in batches of up to 32 (all that are
//! ready) and one at a time (a peer on another thread posts its frames one by one), and
//! with the delivered messages taken every round or only between sends (one thread that
//! both sends and receives with a `Connection`: while it is in `send`, what arrives waits
//! in the core, holding its receive).

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{ConnectionConfig, ConnectionStats, SendError};
use tierbuf_transport::test_pair::{Pair, Polling, Reading, Wire};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// How far the clock moves per round.
const TICK: Duration = Duration::from_millis(1);
/// Rounds without a message delivered or a byte accepted that count as a stall: a
/// second of the synthetic clock. A whole exchange below takes a few hundred rounds.
const STALL_ROUNDS: u64 = 1_000;
/// Rounds an exchange may take at most: 20 s, well inside the storage ladder's 60 s
/// `demote_after`, so no demotion can end a stall within it.
const MAX_ROUNDS: u64 = 20_000;
/// Requests each side sends per exchange.
const REQUESTS: u64 = 32;
/// The most completions `Connection` takes per poll.
const POLL_BATCH: usize = 32;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The message `from` sends as its `index`th request or as the reply to the peer's
/// `index`th request: 512 B to 4 MiB, its length spread evenly over the powers of two from
/// 2^9 to 2^22 and cut at 4 MiB (so about one in five passes the top tier's 1 MiB slot and
/// is segmented), starting with its kind and index, the rest pseudo-random.
fn message(seed: u64, from: usize, kind: u8, index: u64) -> Vec<u8> {
    let mut state = (seed << 32 ^ (from as u64) << 24 ^ u64::from(kind) << 16 ^ index)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1;
    for _ in 0..4 {
        xorshift(&mut state);
    }
    let r = xorshift(&mut state);
    let power = 1usize << (9 + r % 14);
    let len = (power + (r >> 8) as usize % power).clamp(512, 4 * MIB);
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        bytes.extend_from_slice(&xorshift(&mut state).to_le_bytes());
    }
    bytes.truncate(len);
    bytes[0] = kind;
    bytes[1..9].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// Every message of an exchange, made once for all the ways it is run:
/// `[from][kind - 1][index]`.
struct Messages([[Vec<Rc<[u8]>>; 2]; 2]);

impl Messages {
    fn new(seed: u64) -> Rc<Messages> {
        let of = |from, kind| {
            (0..REQUESTS)
                .map(|index| Rc::from(message(seed, from, kind, index)))
                .collect()
        };
        Rc::new(Messages(
            [0, 1].map(|from| [of(from, REQUEST), of(from, REPLY)]),
        ))
    }

    fn get(&self, from: usize, kind: u8, index: u64) -> Rc<[u8]> {
        Rc::clone(&self.0[from][usize::from(kind - 1)][index as usize])
    }
}

/// When a side's user takes the messages delivered to it.
#[derive(Debug, Clone, Copy)]
enum Taking {
    /// Every round, also while one of its own is being sent.
    EveryRound,
    /// Only while none of its own is being sent.
    BetweenSends,
}

/// One side's user: the message it is sending and the requests it keeps count of.
#[derive(Default)]
struct User {
    /// The message being sent and how much of it is posted.
    sending: Option<(Rc<[u8]>, usize)>,
    /// Requests of the peer to answer, by index.
    to_answer: VecDeque<u64>,
    next_request: u64,
    requests_in_flight: usize,
    requests_received: u64,
    replies_received: u64,
}

/// Two sides exchanging requests and replies.
struct Exchange {
    pair: Pair,
    users: [User; 2],
    /// How each progress pass takes completions.
    polling: Polling,
    /// The messages each side has yet to receive, in the order the peer sent them.
    expected: [VecDeque<Rc<[u8]>>; 2],
    messages: Rc<Messages>,
    window: usize,
    taking: Taking,
    round: u64,
    delivered: u64,
    /// What moved in the last round: a message delivered or a byte accepted.
    moved: bool,
}

impl Exchange {
    fn new(
        ladder: TierLadder,
        messages: &Rc<Messages>,
        window: usize,
        polling: Polling,
        taking: Taking,
    ) -> Exchange {
        let config = ConnectionConfig::new(Arc::new(ladder)).unwrap();
        let mut pair = Pair::new(config, [256 << 20; 2]);
        pair.wire = Wire::AtPost;
        for at in 0..2 {
            pair.users[at].reading = Reading::Nothing;
            pair.pass(at, polling);
        }
        Exchange {
            pair,
            users: Default::default(),
            polling,
            expected: [VecDeque::new(), VecDeque::new()],
            messages: Rc::clone(messages),
            window,
            taking,
            round: 0,
            delivered: 0,
            moved: false,
        }
    }

    fn done(&self) -> bool {
        self.users
            .iter()
            .all(|user| user.requests_received == REQUESTS && user.replies_received == REQUESTS)
    }

    /// One round: each side in turn takes what was delivered, offers its message, and
    /// makes a progress pass.
    fn round(&mut self) {
        self.round += 1;
        self.pair.now += TICK;
        self.moved = false;
        for at in 0..2 {
            if matches!(self.taking, Taking::EveryRound) || self.users[at].sending.is_none() {
                self.take_delivered(at);
            }
            let window = self.window;
            let user = &mut self.users[at];
            if user.sending.is_none() {
                let next = if let Some(index) = user.to_answer.pop_front() {
                    Some(self.messages.get(at, REPLY, index))
                } else if user.requests_in_flight < window && user.next_request < REQUESTS {
                    user.requests_in_flight += 1;
                    user.next_request += 1;
                    Some(self.messages.get(at, REQUEST, user.next_request - 1))
                } else {
                    None
                };
                if let Some(bytes) = next {
                    self.expected[1 - at].push_back(Rc::clone(&bytes));
                    user.sending = Some((bytes, 0));
                }
            }
            if let Some((bytes, mut posted)) = user.sending.take() {
                match self.pair.try_send_some(at, &bytes[posted..]) {
                    Ok(accepted) => {
                        posted += accepted;
                        self.moved |= accepted > 0;
                    }
                    Err(SendError::WouldBlock(_)) => {}
                    Err(error) => panic!("side {at}: send failed: {error}"),
                }
                if posted < bytes.len() {
                    user.sending = Some((bytes, posted));
                }
            }
            self.pair.pass(at, self.polling);
        }
    }

    /// Takes every message delivered to side `at`, checks it byte for byte against the
    /// next one the peer sent, and books it.
    fn take_delivered(&mut self, at: usize) {
        while let Some(message) = self.pair.try_recv(at) {
            let expected = self.expected[at]
                .pop_front()
                .unwrap_or_else(|| panic!("side {at} got a message nobody sent"));
            assert_eq!(message.len(), expected.len(), "side {at}: length");
            assert!(
                message[..] == expected[..],
                "side {at}: a {}-byte message differs from the one sent",
                message.len()
            );
            let index = u64::from_le_bytes(expected[1..9].try_into().unwrap());
            let user = &mut self.users[at];
            match expected[0] {
                REQUEST => {
                    user.requests_received += 1;
                    user.to_answer.push_back(index);
                }
                _ => {
                    user.replies_received += 1;
                    user.requests_in_flight -= 1;
                }
            }
            self.delivered += 1;
            self.moved = true;
        }
    }

    fn stats(&self) -> [ConnectionStats; 2] {
        [0, 1].map(|at| self.pair.stats(at))
    }

    /// What each side is waiting to send, for a failure message.
    fn waiting(&self) -> String {
        let describe = |at: usize| match &self.users[at].sending {
            Some((bytes, posted)) => format!(
                "side {at} a {}-byte {} with {posted} bytes posted",
                bytes.len(),
                if bytes[0] == REQUEST {
                    "request"
                } else {
                    "reply"
                }
            ),
            None => format!("side {at} nothing"),
        };
        format!("{}, {}", describe(0), describe(1))
    }
}

fn frames_sent(stats: &[ConnectionStats; 2]) -> u64 {
    stats.iter().map(|s| s.frames_sent).sum()
}

/// The `storage` preset with `demote_after` (and the hysteresis) shortened.
fn storage_demoting_after(demote_after: Duration) -> TierLadder {
    TierLadder::builder()
        .tier(4 * KIB, 32, 4 * KIB)
        .tier(64 * KIB, 16, 64 * KIB)
        .tier(MIB, 4, MIB)
        .demote_after(demote_after)
        .hysteresis(demote_after / 2)
        .retain_replaced(false)
        .reservoir_regions(2)
        .build()
        .unwrap()
}

#[test]
fn requests_both_ways_on_the_storage_ladder_never_stall_on_credit_frames() {
    let messages = Messages::new(1);
    for polling in [Polling::Drain { batch: POLL_BATCH }, Polling::One] {
        for taking in [Taking::EveryRound, Taking::BetweenSends] {
            for window in 2..=4 {
                let ladder = TierLadder::preset("storage").unwrap();
                let mut exchange = Exchange::new(ladder, &messages, window, polling, taking);
                let case = format!(
                    "{window} requests in flight, completions taken {polling:?}, messages \
                     taken {taking:?}"
                );
                let mut last_moved = (0, frames_sent(&exchange.stats()));
                while !exchange.done() {
                    assert!(
                        exchange.round < MAX_ROUNDS,
                        "{case}: not done after {MAX_ROUNDS} rounds"
                    );
                    exchange.round();
                    let stats = exchange.stats();
                    if exchange.moved {
                        last_moved = (exchange.round, frames_sent(&stats));
                        continue;
                    }
                    let (since, frames_then) = last_moved;
                    assert!(
                        exchange.round - since < STALL_ROUNDS,
                        "{case}: no message delivered and no byte accepted for {STALL_ROUNDS} \
                         rounds ({:?} of the clock) after {} messages, while the two sides \
                         posted {} frames; waiting: {}; send credits now {} and {}, receives \
                         posted {} and {}",
                        TICK * STALL_ROUNDS as u32,
                        exchange.delivered,
                        frames_sent(&stats) - frames_then,
                        exchange.waiting(),
                        stats[0].send_credits,
                        stats[1].send_credits,
                        stats[0].posted_receives,
                        stats[1].posted_receives,
                    );
                }
                assert_eq!(exchange.delivered, 4 * REQUESTS, "{case}");
                assert!(exchange.expected.iter().all(VecDeque::is_empty), "{case}");
            }
        }
    }
}

/// The same traffic on the storage ladder with `demote_after` cut to 2 s, run to the end
/// however long it stalls: traffic that never pauses must neither go a second without
/// progress nor demote (a stall would end only with a demotion, `demote_after` after the
/// last large message).
#[test]
fn no_stall_is_left_for_a_demotion_to_end() {
    let demote_after = Duration::from_secs(2);
    let ladder = storage_demoting_after(demote_after);
    let mut exchange = Exchange::new(
        ladder,
        &Messages::new(1),
        3,
        Polling::Drain { batch: POLL_BATCH },
        Taking::EveryRound,
    );
    let mut last_moved = (0, frames_sent(&exchange.stats()));
    // The longest stretch in which nothing moved: rounds, frames posted meanwhile.
    let mut longest = (0, 0);
    while !exchange.done() {
        assert!(
            exchange.round < MAX_ROUNDS,
            "not done after {MAX_ROUNDS} rounds"
        );
        exchange.round();
        if exchange.moved {
            let frames = frames_sent(&exchange.stats());
            let stretch = (exchange.round - last_moved.0 - 1, frames - last_moved.1);
            longest = longest.max(stretch);
            last_moved = (exchange.round, frames);
        }
    }
    let stats = exchange.stats();
    assert!(
        longest.0 < STALL_ROUNDS && stats.iter().all(|s| s.tiers.demotions == 0),
        "nothing moved for {} rounds ({:?} of the clock; demote_after {demote_after:?}) while \
         {} frames were posted, and the sides demoted {} and {} times",
        longest.0,
        TICK * longest.0 as u32,
        longest.1,
        stats[0].tiers.demotions,
        stats[1].tiers.demotions,
    );
    assert_eq!(exchange.delivered, 4 * REQUESTS);
}
