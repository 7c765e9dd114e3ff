//! Target `core_frames`: one [`ConnectionCore`] (sans-IO, `docs/connection.md`) whose peer
//! is the fuzz input.
//!
//! The core is side 0 of a scripted test pair (`tierbuf_transport::test_pair`, feature
//! `test-pair`), which carries out its work requests as the verbs rules say (receives are
//! consumed in posting order, a send is completed when the input says so); the harness is
//! its peer, and the input is a sequence of [`Op`]s: frames the
//! peer writes into the oldest posted receive and completes with a length of its choosing
//! (at most the receive's), messages the core's user sends, reads, holds and drops, send
//! completions, and the passing of time. The ladder is small (three tiers of four slots:
//! 128 B, 1 KiB, 8 KiB), and the first byte of the input picks a budget that holds every
//! tier or only the two smallest. After every step it asserts:
//!
//! - **The core never panics, and fails only for the peer.** Whatever the frames, the core
//!   either goes on or fails with a [`ConnectionError`] whose fault is the peer's
//!   ([`ConnectionCore::failure`]); once failed, every completion reports the failure.
//! - **Frames are taken as the rules say.** A reference model of reception (header
//!   validity, grants on the ladder, reassembly, the maximum message length) predicts for
//!   each data, credit and drain frame whether the core takes it or fails, and the core
//!   does as predicted; every message it delivers is, byte for byte and in order, the one
//!   the model made of the frames (control frames go to the negotiation, which the model
//!   does not predict: they may fail the core, for the peer). An exposed message
//!   (`docs/protocol.md`, "Rendezvous") is read by nobody here: the core takes a valid
//!   one and holds every message after it behind it, unless its budget cannot land the
//!   read and it asks for segments, when the next message reassembled must be of the
//!   exposed length and comes first; answers to exposures are refused (the core's own
//!   large messages go in segments: `DataPath::TwoSided`).
//! - **Credits (rules 1 and 2).** Every frame the core posts decodes, carries a grant on
//!   the ladder, is exactly its header and payload long, and lands in a receive of the
//!   peer that the peer granted and that is at least as long (the peer's receives are
//!   modelled from its grants, in posting order, starting with the smallest tier's slot
//!   count); the core's count of credits is the model's. The core's own grants name its
//!   posted receives in posting order, tier by tier, and never more than it posted.
//! - **Buffers.** Every receive is a slot of one of the ladder's tiers; no receive or
//!   send the core posts overlaps another one outstanding (the pair checks it at each
//!   post); a message the user holds in
//!   its receive slot overlaps no posted receive and keeps its bytes to the end.
//! - **Bounds.** At most `ConnectionConfig::queue_depth` receives are posted; registered
//!   bytes stay within the two largest tiers per direction (`docs/policy.md`, "What a
//!   peer can make this side hold"), both as the core counts them and as the budget
//!   charges them, and one region to read an exposed message into, of at most the
//!   maximum message length.
//! - **Nothing leaks.** Once the messages are dropped and the core with them, the budget
//!   holds nothing.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::negotiation::TierShape;
use tierbuf_tiers::wire::{ControlMessage, Epoch};
use tierbuf_tiers::{RegionDescriptor, TierIndex, ladder::TierLadder};
use tierbuf_transport::BufferRef;
use tierbuf_transport::connection::{
    ConnectionConfig, ConnectionError, DataPath, Fault, FrameKind, HEADER_LEN, Message, SendError,
};
use tierbuf_transport::fuzzing::{FrameHeaderFields, decode_frame_header, encode_frame_header};
use tierbuf_transport::test_pair::{Pair, Posted};

use crate::control_codec::{read_message, write_message};
use crate::frame_header::{frame, read_fields, write_fields};
use crate::reader::{Reader, put_bytes};

/// The largest message the core takes: small enough that a peer's announced length costs
/// the fuzzer little, large enough for every message of the ladder.
const MAX_MESSAGE_LEN: u64 = 1 << 20;

/// Messages the user holds at most at once.
const MAX_HELD: usize = 16;

/// One step of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// The peer writes `frame` (cut to the receive's length) into the oldest posted
    /// receive and completes it with `reported` bytes, or the bytes written when `None`
    /// (cut to the receive's length too: a provider never reports more).
    Deliver {
        /// The bytes written.
        frame: &'a [u8],
        /// The length the completion reports.
        reported: Option<u32>,
    },
    /// The user offers a message of this many bytes.
    Send(u16),
    /// The user takes the next message, and drops it at once or holds it.
    Recv {
        /// Whether the user holds it (at most [`MAX_HELD`]).
        hold: bool,
    },
    /// The user drops the message it has held longest.
    DropHeld,
    /// The peer completes up to this many of the core's sends, oldest first.
    CompleteSends(u8),
    /// This many milliseconds pass, then the core makes progress.
    Advance(u16),
    /// The core makes progress.
    Progress,
    /// The peer writes a frame of these header fields and a payload of their length into
    /// the oldest posted receive, and completes it with the frame's length.
    Frame(FrameHeaderFields),
    /// The peer writes a control frame granting `grant` (tier, count) and carrying
    /// `message` (nothing, if the codec refuses the message).
    Control {
        /// The receives the frame grants.
        grant: (u8, u16),
        /// The negotiation message.
        message: ControlMessage,
    },
}

impl<'a> Op<'a> {
    /// The next step of `input`.
    fn read(input: &mut Reader<'a>) -> Option<Op<'a>> {
        Some(match input.u8()? % 10 {
            0 => Op::Deliver {
                frame: input.byte_string()?,
                reported: None,
            },
            1 => {
                let reported = input.u32()?;
                Op::Deliver {
                    frame: input.byte_string()?,
                    reported: Some(reported),
                }
            }
            2 => Op::Send(input.u16()?),
            3 => Op::Recv { hold: false },
            4 => Op::Recv { hold: true },
            5 => Op::DropHeld,
            6 => Op::CompleteSends(input.u8()?),
            7 => match input.u16()? {
                0 => Op::Progress,
                millis => Op::Advance(millis),
            },
            8 => Op::Frame(read_fields(input)?),
            _ => Op::Control {
                grant: (input.u8()?, input.u16()?),
                message: read_message(input)?,
            },
        })
    }

    /// Appends the step as [`Op::read`] reads it.
    fn write(&self, out: &mut Vec<u8>) {
        match *self {
            Op::Deliver {
                frame,
                reported: None,
            } => {
                out.push(0);
                put_bytes(out, frame);
            }
            Op::Deliver {
                frame,
                reported: Some(reported),
            } => {
                out.push(1);
                out.extend_from_slice(&reported.to_le_bytes());
                put_bytes(out, frame);
            }
            Op::Send(len) => {
                out.push(2);
                out.extend_from_slice(&len.to_le_bytes());
            }
            Op::Recv { hold } => out.push(if hold { 4 } else { 3 }),
            Op::DropHeld => out.push(5),
            Op::CompleteSends(count) => out.extend_from_slice(&[6, count]),
            Op::Advance(millis) => {
                out.push(7);
                out.extend_from_slice(&millis.to_le_bytes());
            }
            Op::Progress => out.extend_from_slice(&[7, 0, 0]),
            Op::Frame(header) => {
                out.push(8);
                write_fields(&header, out);
            }
            Op::Control { grant, message } => {
                out.push(9);
                out.push(grant.0);
                out.extend_from_slice(&grant.1.to_le_bytes());
                write_message(&message, out);
            }
        }
    }
}

/// Runs one input (module documentation).
pub fn run(data: &[u8]) {
    let mut input = Reader::new(data);
    let Some(setup) = input.u8() else {
        return;
    };
    let mut harness = Harness::new(setup & 1 == 1);
    while let Some(op) = Op::read(&mut input) {
        harness.apply(op);
        harness.check();
    }
    harness.finish();
}

/// The ladder: three tiers of four slots.
fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(128, 4, 112)
            .tier(1024, 4, 1008)
            .tier(8192, 4, 8176)
            .build()
            .expect("the fuzz ladder is valid"),
    )
}

/// What the budget charges a region of `len` bytes: the whole pages it maps.
fn charged(len: usize) -> u64 {
    len.next_multiple_of(tierbuf_pool::page_size()) as u64
}

/// What the reference model makes of one received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The core must take it.
    Taken,
    /// The core must fail, for the peer.
    Refused,
    /// A control frame: the negotiation decides.
    Control,
}

/// An exposed message the core took (module documentation).
#[derive(Debug)]
struct Exposed {
    /// Its length.
    len: u64,
    /// Whether the core asked for it in segments (it could not land the read).
    refused: bool,
    /// Messages made after it, delivered only after it.
    behind: Vec<Vec<u8>>,
}

/// The reference model of reception: the messages the frames received so far make.
#[derive(Debug, Default)]
struct Reception {
    /// The segmented message being received: its announced length and bytes so far.
    open: Option<(u64, Vec<u8>)>,
    /// Messages made and not yet taken by the user, oldest first.
    made: VecDeque<Vec<u8>>,
    /// The exposed message taken and not delivered.
    exposed: Option<Exposed>,
}

impl Reception {
    /// Takes `frame` as the rules of `docs/connection.md` say; returns the verdict, and the
    /// grant (tier, count) the core applies when the header is valid, the tier on a ladder
    /// of `tiers` tiers, and the count within `credit_room` (what the core may still hold
    /// beyond its credits: `ConnectionConfig::max_send_credits` less them).
    fn receive(
        &mut self,
        frame: &[u8],
        tiers: usize,
        credit_room: u64,
    ) -> (Verdict, Option<(u8, u16)>) {
        let Ok(header) = decode_frame_header(frame) else {
            return (Verdict::Refused, None);
        };
        if usize::from(header.grant_tier) >= tiers || u64::from(header.grant_count) > credit_room {
            return (Verdict::Refused, None);
        }
        let grant = Some((header.grant_tier, header.grant_count));
        let payload = &frame[HEADER_LEN..HEADER_LEN + header.payload_len as usize];
        let verdict = match header.kind {
            FrameKind::Whole => {
                if self.open.is_some() || header.message_len > MAX_MESSAGE_LEN {
                    Verdict::Refused
                } else {
                    self.make(payload.to_vec());
                    Verdict::Taken
                }
            }
            FrameKind::First => {
                if self.open.is_some() || header.message_len > MAX_MESSAGE_LEN {
                    Verdict::Refused
                } else {
                    self.open = Some((header.message_len, payload.to_vec()));
                    Verdict::Taken
                }
            }
            FrameKind::Middle | FrameKind::Last => match &mut self.open {
                None => Verdict::Refused,
                Some((announced, bytes)) => {
                    let received = (bytes.len() + payload.len()) as u64;
                    let last = header.kind == FrameKind::Last;
                    if received > *announced || (last && received != *announced) {
                        Verdict::Refused
                    } else {
                        bytes.extend_from_slice(payload);
                        if last {
                            let (_, message) = self.open.take().expect("open");
                            return (self.reassembled(message), grant);
                        }
                        Verdict::Taken
                    }
                }
            },
            FrameKind::Packed => match packed_messages(payload, header.message_len) {
                Some(messages)
                    if self.open.is_none()
                        && messages
                            .iter()
                            .all(|message| message.len() as u64 <= MAX_MESSAGE_LEN) =>
                {
                    for message in messages {
                        self.make(message);
                    }
                    Verdict::Taken
                }
                _ => Verdict::Refused,
            },
            FrameKind::Exposed => {
                let range = u32::from_le_bytes(payload[4..8].try_into().expect("4 bytes"));
                if self.open.is_some()
                    || header.message_len > MAX_MESSAGE_LEN
                    || self.exposed.is_some()
                    || u64::from(range) != header.message_len
                {
                    Verdict::Refused
                } else {
                    self.exposed = Some(Exposed {
                        len: header.message_len,
                        refused: false,
                        behind: Vec::new(),
                    });
                    Verdict::Taken
                }
            }
            // The core sends in segments: it exposes nothing to be answered.
            FrameKind::ReadDone | FrameKind::ReadRefused => Verdict::Refused,
            FrameKind::Control => Verdict::Control,
            FrameKind::Credit | FrameKind::Drain => Verdict::Taken,
        };
        (verdict, grant)
    }

    /// A message made of frames: the user's next, unless it waits behind an exposed one.
    fn make(&mut self, message: Vec<u8>) {
        match &mut self.exposed {
            Some(exposed) => exposed.behind.push(message),
            None => self.made.push_back(message),
        }
    }

    /// A segmented message reassembled: the exposed message the core asked for in
    /// segments, which must be as long, or any other.
    fn reassembled(&mut self, message: Vec<u8>) -> Verdict {
        let Some(exposed) = self.exposed.take_if(|exposed| exposed.refused) else {
            self.make(message);
            return Verdict::Taken;
        };
        if message.len() as u64 != exposed.len {
            return Verdict::Refused;
        }
        self.made.push_back(message);
        self.made.extend(exposed.behind);
        Verdict::Taken
    }
}

/// The messages of a packed frame's payload, if it is exactly `count` entries as
/// `docs/protocol.md` lays them out: a length (`u32`, little endian), four zero bytes, the
/// message, zeros to the next multiple of eight.
fn packed_messages(payload: &[u8], count: u64) -> Option<Vec<Vec<u8>>> {
    let mut messages = Vec::new();
    let mut rest = payload;
    for _ in 0..count {
        let head = rest.get(..8)?;
        let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
        if head[4..] != [0; 4] {
            return None;
        }
        let padded = len.checked_next_multiple_of(8)?;
        messages.push(rest.get(8..8 + len)?.to_vec());
        rest = rest.get(8 + padded..)?;
    }
    rest.is_empty().then_some(messages)
}

/// Whether two buffers share a byte.
fn overlap(a: &BufferRef, b: &BufferRef) -> bool {
    a.addr < b.addr + u64::from(b.len) && b.addr < a.addr + u64::from(a.len)
}

/// The core on its pair, and the model of its peer.
struct Harness {
    config: Arc<ConnectionConfig>,
    budget: MemoryBudget,
    /// The core, side 0; the harness plays side 1.
    pair: Pair,
    /// The peer's receives the core may send into, as (tier, count) runs in posting
    /// order: the model of the core's credits.
    peer_receives: VecDeque<(u8, u64)>,
    /// The tiers of receives the core posted and has not granted yet, oldest first (the
    /// first tier's, which the peer counts from the start, are not among them).
    ungranted: VecDeque<u8>,
    reception: Reception,
    /// Messages the user holds, with the bytes they had when delivered.
    held: VecDeque<(Message, Vec<u8>)>,
    /// A bound on registered bytes: the two largest tiers, per direction.
    registered_bound: u64,
    /// The same bound, as the budget charges it.
    charged_bound: u64,
    /// The core's count of exposed messages it could not read.
    reads_refused: u64,
}

impl Harness {
    fn new(tight_budget: bool) -> Harness {
        let ladder = ladder();
        let config = Arc::new(
            ConnectionConfig::new(Arc::clone(&ladder))
                .expect("the fuzz ladder makes connections")
                .with_max_message_len(MAX_MESSAGE_LEN)
                .with_data_path(DataPath::TwoSided),
        );
        let mut regions: Vec<usize> = ladder.tiers().iter().map(|t| t.region_len()).collect();
        regions.sort_unstable_by(|a, b| b.cmp(a));
        let two_largest = &regions[..2];
        let registered_bound = 2 * two_largest.iter().sum::<usize>() as u64;
        let charged_bound = 2 * two_largest.iter().map(|&len| charged(len)).sum::<u64>();
        // Tight: each direction's two smallest tiers, so the peer's requests for the top
        // tier are refused for budget.
        let cap = if tight_budget {
            2 * ladder.tiers()[..2]
                .iter()
                .map(|t| charged(t.region_len()))
                .sum::<u64>()
        } else {
            4 * charged_bound
        };
        let mut pair = Pair::scripted(Arc::clone(&config), cap);
        pair.record_posts(0);
        let first = ladder.tiers()[0].slot_count();
        let harness = Harness {
            config,
            budget: pair.budget(0).clone(),
            pair,
            peer_receives: VecDeque::from([(0, first as u64)]),
            ungranted: VecDeque::new(),
            reception: Reception::default(),
            held: VecDeque::new(),
            registered_bound,
            charged_bound,
            reads_refused: 0,
        };
        assert_eq!(
            harness.pair.posted_recvs(0).len(),
            first,
            "the first tier's receives are posted"
        );
        for buffer in harness.pair.posted_recvs(0) {
            harness.tier_of(&buffer);
        }
        harness.check();
        harness
    }

    fn ladder(&self) -> &TierLadder {
        self.config.ladder()
    }

    fn failed(&self) -> bool {
        self.pair.failure(0).is_some()
    }

    fn apply(&mut self, op: Op<'_>) {
        match op {
            Op::Deliver { frame, reported } => self.deliver(frame, reported),
            Op::Send(len) => self.send(usize::from(len)),
            Op::Recv { hold } => self.recv(hold),
            Op::DropHeld => drop(self.held.pop_front()),
            Op::CompleteSends(count) => {
                for _ in 0..count {
                    let failed = self.failed();
                    let Some(taken) = self.pair.take(0) else {
                        break;
                    };
                    let result = taken.result;
                    assert_eq!(result.is_err(), failed, "send completion: {result:?}");
                }
            }
            Op::Advance(millis) => {
                self.pair.now += Duration::from_millis(u64::from(millis));
                self.pair.progress(0);
            }
            Op::Progress => self.pair.progress(0),
            Op::Frame(header) => {
                let payload: Vec<u8> = (0..header.payload_len).map(|i| i as u8).collect();
                let mut frame = encode_frame_header(&header).to_vec();
                frame.extend_from_slice(&payload);
                self.deliver(&frame, None);
            }
            Op::Control { grant, message } => {
                if let Some(frame) = control(&message, grant) {
                    self.deliver(&frame, None);
                }
            }
        }
        self.check_posts();
    }

    /// The peer's frame into the oldest posted receive.
    fn deliver(&mut self, bytes: &[u8], reported: Option<u32>) {
        let failed_before = self.failed();
        let Some(landed) = self.pair.forge(0, bytes, reported) else {
            return;
        };
        let (result, frame) = (landed.result, landed.frame);
        if failed_before {
            assert!(result.is_err(), "a failed core took a completion");
            return;
        }
        let tiers = self.ladder().len();
        let held: u64 = self.peer_receives.iter().map(|(_, run)| run).sum();
        let credit_room = u64::from(self.config.max_send_credits()).saturating_sub(held);
        let (verdict, grant) = self.reception.receive(&frame, tiers, credit_room);
        // Whether the core could land an exposed message's read, it says by its count.
        let refused_before = self.reads_refused;
        self.reads_refused = self.pair.stats(0).reads_refused;
        if self.reads_refused > refused_before
            && let Some(exposed) = &mut self.reception.exposed
        {
            exposed.refused = true;
        }
        if let Some((tier, count)) = grant
            && count > 0
        {
            match self.peer_receives.back_mut() {
                Some((last, run)) if *last == tier => *run += u64::from(count),
                _ => self.peer_receives.push_back((tier, u64::from(count))),
            }
        }
        match verdict {
            Verdict::Taken => {
                assert!(result.is_ok(), "refused {frame:?}: {result:?}");
            }
            Verdict::Refused => {
                let error = result.expect_err("took a frame the rules refuse");
                assert!(
                    matches!(*error, ConnectionError::PeerProtocol(_)),
                    "{frame:?} failed the core with {error:?}"
                );
            }
            Verdict::Control => {}
        }
    }

    /// The user offers a message of `len` bytes.
    fn send(&mut self, len: usize) {
        let message: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        match self.pair.try_send(0, &[IoSlice::new(&message)]) {
            Ok(()) => assert!(!self.failed()),
            Err(SendError::WouldBlock(_)) => assert!(!self.failed()),
            Err(SendError::Failed(_)) => assert!(self.failed()),
            Err(other) => panic!("a {len}-byte send failed: {other:?}"),
        }
    }

    /// The user takes the next message.
    fn recv(&mut self, hold: bool) {
        let message = self.pair.try_recv(0);
        let made = self.reception.made.pop_front();
        match (message, made) {
            (None, None) => {}
            (Some(message), Some(made)) => {
                assert!(*message == *made, "delivered bytes differ from the frames'");
                if hold && self.held.len() < MAX_HELD {
                    self.held.push_back((message, made));
                }
            }
            (message, made) => panic!(
                "delivered {:?} where the frames made {:?}",
                message.map(|m| m.len()),
                made.map(|m| m.len())
            ),
        }
    }

    /// Checks each work request the core handed out since the last look, in order.
    fn check_posts(&mut self) {
        for posted in self.pair.take_posts(0) {
            match posted {
                Posted::Recv(buffer) => self.posted_recv(&buffer),
                Posted::Send(frame) => self.posted_send(&frame),
            }
        }
    }

    /// The tier whose slot `buffer` is.
    fn tier_of(&self, buffer: &BufferRef) -> u8 {
        self.ladder()
            .tiers()
            .iter()
            .position(|t| t.slot_len() == buffer.len as usize)
            .unwrap_or_else(|| panic!("a receive of {} bytes is no tier's slot", buffer.len))
            as u8
    }

    fn posted_recv(&mut self, buffer: &BufferRef) {
        let tier = self.tier_of(buffer);
        self.ungranted.push_back(tier);
    }

    fn posted_send(&mut self, frame: &[u8]) {
        let header = decode_frame_header(frame)
            .unwrap_or_else(|error| panic!("the core posted a frame it would refuse: {error}"));
        assert_eq!(HEADER_LEN + header.payload_len as usize, frame.len());
        assert!(usize::from(header.grant_tier) < self.ladder().len());
        for _ in 0..header.grant_count {
            let tier = self
                .ungranted
                .pop_front()
                .expect("the core granted receives it never posted");
            assert_eq!(tier, header.grant_tier, "grants out of posting order");
        }
        let (tier, run) = self
            .peer_receives
            .front_mut()
            .expect("the core sent a frame with no credit");
        let slot = self.config.ladder().tiers()[usize::from(*tier)].slot_len();
        assert!(
            frame.len() <= slot,
            "a {}-byte frame into a {slot}-byte receive of tier {tier}",
            frame.len()
        );
        *run -= 1;
        if *run == 0 {
            self.peer_receives.pop_front();
        }
    }

    /// The invariants that hold after every step.
    fn check(&self) {
        let stats = self.pair.stats(0);
        let posted = self.pair.posted_recvs(0).len();
        if let Some(error) = self.pair.failure(0) {
            assert_eq!(error.fault(), Fault::Peer, "failed: {error:?}");
        } else {
            let credits: u64 = self.peer_receives.iter().map(|&(_, run)| run).sum();
            assert_eq!(stats.send_credits, credits, "the core's credits");
            // (A failed core takes no more completions, so its receives stay counted.)
            assert_eq!(stats.posted_receives, posted as u64);
        }
        assert!(posted as u64 <= u64::from(self.config.queue_depth()));
        assert!(
            stats.registered_bytes <= self.registered_bound,
            "{} bytes registered, bound {}",
            stats.registered_bytes,
            self.registered_bound
        );
        // One region at most to read an exposed message into, which the harness never
        // completes (so none is kept as a spare).
        let landing = charged(MAX_MESSAGE_LEN as usize);
        assert!(stats.rendezvous_bytes <= landing, "{stats:?}");
        assert!(self.budget.in_use() <= self.charged_bound + landing);
        for (message, _) in self.held.iter().filter(|(m, _)| m.is_zero_copy()) {
            let held = BufferRef {
                remote_key: 0,
                addr: message.as_ptr() as u64,
                len: message.len() as u32,
            };
            for posted in self.pair.posted_recvs(0) {
                assert!(!overlap(&held, &posted), "a held message's slot is posted");
            }
        }
    }

    /// Takes the messages left, checks them and the held ones, and drops everything.
    fn finish(mut self) {
        // `recv` checks each message against the model's, and that neither has one more.
        while !self.reception.made.is_empty() {
            self.recv(false);
        }
        self.recv(false);
        for (message, bytes) in &self.held {
            assert!(**message == **bytes, "a held message changed");
        }
        let budget = self.budget.clone();
        drop(self);
        assert_eq!(budget.in_use(), 0, "registered bytes left behind");
    }
}

/// An ack of `epoch` for `tier` of the fuzz ladder, as a peer sends it.
fn ack(epoch: u64, tier: u8) -> ControlMessage {
    let ladder = ladder();
    let spec = &ladder.tiers()[usize::from(tier)];
    ControlMessage::Ack {
        epoch: Epoch::new(epoch),
        tier: TierIndex::new(tier),
        shape: TierShape {
            slot_size: spec.slot_len() as u32,
            slot_count: spec.slot_count() as u32,
        },
        region: RegionDescriptor {
            addr: 0x7f00_0000_0000,
            len: spec.region_len() as u64,
            remote_key: 11,
        },
    }
}

/// A control frame carrying `message`, granting `grant`, unless the codec refuses the
/// message.
fn control(message: &ControlMessage, grant: (u8, u16)) -> Option<Vec<u8>> {
    let payload = crate::control_codec::frame(message)?;
    Some(frame(FrameKind::Control, grant, 0, &payload))
}

/// The input of `setup` and `ops`.
fn input(setup: u8, ops: &[Op<'_>]) -> Vec<u8> {
    let mut out = vec![setup];
    for op in ops {
        op.write(&mut out);
    }
    out
}

/// The seeds: conversations a well-behaved peer holds, and a few it should not.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let hello = frame(FrameKind::Whole, (0, 1), 5, b"hello");
    let whole = frame(FrameKind::Whole, (0, 1), 100, &[7; 100]);
    let first = frame(FrameKind::First, (0, 1), 250, &[1; 100]);
    let middle = frame(FrameKind::Middle, (0, 1), 0, &[2; 100]);
    let last = frame(FrameKind::Last, (0, 1), 0, &[3; 50]);
    let credit = frame(FrameKind::Credit, (0, 3), 0, &[]);
    let drain = frame(FrameKind::Drain, (0, 1), 0, &[]);
    // Three messages of 3, 0 and 9 bytes in one packed frame, then one whose second
    // entry runs past the frame.
    let mut entries = Vec::new();
    for message in [&b"abc"[..], b"", b"123456789"] {
        entries.extend_from_slice(&(message.len() as u32).to_le_bytes());
        entries.extend_from_slice(&[0; 4]);
        entries.extend_from_slice(message);
        entries.resize(entries.len().next_multiple_of(8), 0);
    }
    let packed = frame(FrameKind::Packed, (0, 1), 3, &entries);
    let mut past_frame = entries.clone();
    past_frame[16] = 200;
    let packed_past_frame = frame(FrameKind::Packed, (0, 1), 3, &past_frame);
    let request = |epoch, tier, current| Op::Control {
        grant: (0, 1),
        message: ControlMessage::Request {
            epoch: Epoch::new(epoch),
            tier: TierIndex::new(tier),
            current: Epoch::new(current),
        },
    };
    let released = |epoch| Op::Control {
        grant: (0, 1),
        message: ControlMessage::Released {
            epoch: Epoch::new(epoch),
        },
    };
    let request_top = control(
        &ControlMessage::Request {
            epoch: Epoch::new(1),
            tier: TierIndex::new(2),
            current: Epoch::INITIAL,
        },
        (0, 1),
    )
    .expect("a seed message encodes");
    let big_whole = frame(FrameKind::Whole, (2, 1), 2000, &[9; 2000]);
    // A message exposed for reading (key 7, its length, an address never exposed): the
    // read is carried out by nobody here, so the whole message after it waits behind it;
    // one that the tight budget cannot land is asked for in segments instead.
    let exposed = |len: u32| {
        let mut descriptor = 7u32.to_le_bytes().to_vec();
        descriptor.extend_from_slice(&len.to_le_bytes());
        descriptor.extend_from_slice(&0x1000u64.to_le_bytes());
        frame(FrameKind::Exposed, (0, 1), u64::from(len), &descriptor)
    };
    let (exposed_small, exposed_large) = (exposed(3000), exposed(60_000));
    let mut unknown_kind = frame(FrameKind::Credit, (0, 0), 0, &[]);
    unknown_kind[0] = 0;
    let beyond_ladder = frame(FrameKind::Credit, (3, 1), 0, &[]);
    let deliver = |frame| Op::Deliver {
        frame,
        reported: None,
    };
    let fields = |kind, grant_tier, payload_len, message_len| {
        Op::Frame(FrameHeaderFields {
            kind,
            grant_tier,
            grant_count: 1,
            payload_len,
            message_len,
        })
    };
    vec![
        (
            "messages_both_ways",
            input(
                0,
                &[
                    deliver(&hello),
                    Op::Recv { hold: false },
                    deliver(&whole),
                    Op::Recv { hold: true },
                    Op::Send(50),
                    Op::CompleteSends(4),
                    Op::Progress,
                    Op::DropHeld,
                    Op::Progress,
                    Op::CompleteSends(4),
                ],
            ),
        ),
        (
            "segmented",
            input(
                0,
                &[
                    deliver(&first),
                    deliver(&middle),
                    deliver(&last),
                    Op::Recv { hold: false },
                    Op::Progress,
                    Op::CompleteSends(4),
                ],
            ),
        ),
        (
            "frames_from_fields",
            input(
                0,
                &[
                    fields(FrameKind::Whole, 0, 60, 60),
                    fields(FrameKind::First, 0, 100, 150),
                    fields(FrameKind::Last, 0, 50, 0),
                    Op::Recv { hold: true },
                    Op::Recv { hold: true },
                    fields(FrameKind::Credit, 0, 0, 0),
                    Op::CompleteSends(4),
                ],
            ),
        ),
        (
            "peer_promotes",
            input(
                0,
                &[
                    deliver(&request_top),
                    Op::CompleteSends(4),
                    released(1),
                    deliver(&drain),
                    deliver(&drain),
                    deliver(&drain),
                    Op::Progress,
                    Op::CompleteSends(4),
                    deliver(&big_whole),
                    Op::Recv { hold: false },
                ],
            ),
        ),
        (
            "peer_promotes_then_demotes",
            input(
                0,
                &[
                    request(1, 1, 0),
                    Op::CompleteSends(4),
                    released(1),
                    deliver(&drain),
                    deliver(&drain),
                    deliver(&drain),
                    Op::CompleteSends(4),
                    request(2, 0, 1),
                    Op::CompleteSends(4),
                    released(2),
                    Op::Advance(1000),
                    Op::CompleteSends(4),
                ],
            ),
        ),
        (
            "core_promotes",
            input(
                0,
                &[
                    Op::Send(3000),
                    Op::CompleteSends(8),
                    deliver(&credit),
                    Op::Progress,
                    Op::CompleteSends(8),
                    Op::Control {
                        grant: (2, 4),
                        message: ack(1, 2),
                    },
                    Op::Progress,
                    Op::CompleteSends(8),
                    Op::Send(6000),
                    Op::CompleteSends(8),
                    Op::Advance(40_000),
                    Op::CompleteSends(8),
                ],
            ),
        ),
        (
            "tight_budget",
            input(
                1,
                &[
                    request(1, 2, 0),
                    Op::CompleteSends(4),
                    Op::Send(2000),
                    Op::CompleteSends(8),
                ],
            ),
        ),
        (
            "reported_lengths",
            input(
                0,
                &[
                    Op::Deliver {
                        frame: &hello,
                        reported: Some(3),
                    },
                    Op::Deliver {
                        frame: &whole,
                        reported: Some(u32::MAX),
                    },
                ],
            ),
        ),
        (
            "packed",
            input(
                0,
                &[
                    deliver(&packed),
                    Op::Recv { hold: true },
                    Op::Recv { hold: false },
                    Op::Recv { hold: true },
                    Op::Progress,
                    Op::DropHeld,
                    Op::Progress,
                    Op::CompleteSends(4),
                ],
            ),
        ),
        (
            "packed_past_frame",
            input(0, &[deliver(&packed_past_frame)]),
        ),
        ("unknown_kind", input(0, &[deliver(&unknown_kind)])),
        (
            "exposed",
            input(
                0,
                &[
                    deliver(&exposed_small),
                    deliver(&hello),
                    Op::Recv { hold: false },
                ],
            ),
        ),
        (
            "exposed_refused",
            input(
                1,
                &[
                    deliver(&exposed_large),
                    deliver(&hello),
                    Op::Recv { hold: false },
                    deliver(&frame(FrameKind::First, (0, 1), 60_000, &[1; 100])),
                ],
            ),
        ),
        ("grant_beyond_ladder", input(0, &[deliver(&beyond_ladder)])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed reads as steps that write back to its bytes, so the seeds hold the
    /// conversations they were written as.
    #[test]
    fn the_seeds_read_back_as_written() {
        for (name, seed) in seeds() {
            let mut input = Reader::new(&seed[1..]);
            let mut again = vec![seed[0]];
            while let Some(op) = Op::read(&mut input) {
                op.write(&mut again);
            }
            assert_eq!(again, seed, "{name}");
        }
    }
}
