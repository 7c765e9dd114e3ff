//! Target `shm_records`: what a shared-memory peer writes that this side parses
//! (`docs/transport.md`, the shm provider). The first byte of the input picks the part.
//!
//! - **Even: a bootstrap socket record** (`transport/src/shm/bootstrap.rs`, through the
//!   `fuzzing` feature's wrappers), the rest of the input as the record's bytes, taken with
//!   and without a file descriptor. Decoding never panics and its errors display. A record
//!   it takes is [`SHM_RECORD_LEN`] bytes, came with a descriptor exactly when its kind
//!   carries one (so exactly one of the two readings takes it), re-encodes to bytes with
//!   the input's magic and kind that decode to the same record, and encoding is stable.
//! - **Odd: a ring of the connection segment** (`transport/src/shm/segment.rs`, public
//!   through `tierbuf_transport::shm_segment`), driven by the rest of the input as a
//!   sequence of [`RingOp`]s against a model: the receiver posts buffers, the sender looks
//!   at them and delivers into them (inline messages split into parts anywhere, copied
//!   ones, too-long and unreachable results), the receiver reaps them, shuts its gate or a
//!   side closes. The sender sees each posted buffer as posted and nothing past the last
//!   post; the receiver sees no result before the delivery and then exactly the result
//!   delivered, an inline message byte for byte; a direction's gate refuses every copy
//!   once shut or once the connection is closed, and the first close sticks. A
//!   [`RingOp::Scribble`] overwrites the whole segment with input bytes, as a peer
//!   process may: the model stops there, and what follows must still never panic, and
//!   every result read is one of the segment's forms (an unknown result code is reported
//!   as such, a known one never).
//!
//! Only the ring's own operations are reached: the endpoint's checks of what it reads
//! (`transport/src/shm/endpoint.rs`, a delivered length against the posted buffer) are
//! private to it.

use std::collections::VecDeque;

use tierbuf_transport::fuzzing::{SHM_RECORD_LEN, ShmRecord};
use tierbuf_transport::shm_segment::{
    Filled, INLINE_CAPACITY, PairState, PostedBuffer, PostedView, RingSize, Segment,
};

use crate::reader::{Reader, put_bytes};

/// Entries in the fuzzed segment's rings.
const ENTRIES: usize = 8;

/// The side that sends on the fuzzed direction; the other one receives.
const SENDER: usize = 0;
const RECEIVER: usize = 1;

/// Runs one input (module documentation).
pub fn run(data: &[u8]) {
    match data.split_first() {
        Some((selector, record)) if selector % 2 == 0 => check_record(record),
        Some((_, ops)) => run_ring(ops),
        None => {}
    }
}

/// The input as a bootstrap record (module documentation).
fn check_record(bytes: &[u8]) {
    let readings = [false, true].map(|with_descriptor| {
        let decoded = ShmRecord::decode(bytes, with_descriptor);
        if let Err(error) = &decoded {
            assert!(!error.to_string().is_empty());
        }
        decoded
    });
    let taken: Vec<(bool, ShmRecord)> = [false, true]
        .into_iter()
        .zip(readings)
        .filter_map(|(with_descriptor, decoded)| Some((with_descriptor, decoded.ok()?)))
        .collect();
    assert!(
        taken.len() <= 1,
        "taken with and without a descriptor: {taken:?}"
    );
    let Some(&(with_descriptor, record)) = taken.first() else {
        return;
    };
    assert_eq!(bytes.len(), SHM_RECORD_LEN);
    assert_eq!(record.carries_descriptor(), with_descriptor);
    let encoded = record.encode();
    assert_eq!(encoded[..12], bytes[..12], "magic and kind of {record:?}");
    assert_eq!(ShmRecord::decode(&encoded, with_descriptor), Ok(record));
    assert_eq!(
        ShmRecord::decode(&encoded, with_descriptor).map(|again| again.encode()),
        Ok(encoded)
    );
}

/// One step on the fuzzed direction's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp<'a> {
    /// The receiver posts its next receive.
    Post(PostedBuffer),
    /// The sender looks at its next receive.
    Look,
    /// The sender delivers `message` inline into its next receive, in parts cut at the
    /// two offsets (taken modulo the message's length plus one).
    DeliverInline {
        /// The message (at most [`INLINE_CAPACITY`] bytes are taken).
        message: &'a [u8],
        /// Where the parts are cut.
        cuts: [u8; 2],
    },
    /// The sender reports a copied message of this many bytes into its next receive.
    DeliverCopied(u32),
    /// The sender reports its next receive too short for its message.
    DeliverTooLong,
    /// The sender reports its next receive out of its reach.
    DeliverUnreachable,
    /// The receiver reaps its oldest receive.
    Reap,
    /// The receiver shuts its gate: no copy into its buffers from now on.
    Shut,
    /// A side closes the connection.
    Close(usize),
    /// A peer overwrites the whole segment with these bytes, repeated.
    Scribble(&'a [u8]),
}

impl<'a> RingOp<'a> {
    fn read(input: &mut Reader<'a>) -> Option<RingOp<'a>> {
        Some(match input.u8()? % 10 {
            0 => RingOp::Post(PostedBuffer {
                remote_key: input.u32()?,
                addr: input.u64()?,
                len: input.u32()?,
            }),
            1 => RingOp::Look,
            2 => {
                let cuts = input.array()?;
                RingOp::DeliverInline {
                    message: input.byte_string()?,
                    cuts,
                }
            }
            3 => RingOp::DeliverCopied(input.u32()?),
            4 => RingOp::DeliverTooLong,
            5 => RingOp::DeliverUnreachable,
            6 => RingOp::Reap,
            7 => RingOp::Shut,
            8 => RingOp::Close(usize::from(input.u8()? % 2)),
            _ => RingOp::Scribble(input.byte_string()?),
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        match *self {
            RingOp::Post(buffer) => {
                out.push(0);
                out.extend_from_slice(&buffer.remote_key.to_le_bytes());
                out.extend_from_slice(&buffer.addr.to_le_bytes());
                out.extend_from_slice(&buffer.len.to_le_bytes());
            }
            RingOp::Look => out.push(1),
            RingOp::DeliverInline { message, cuts } => {
                out.push(2);
                out.extend_from_slice(&cuts);
                put_bytes(out, message);
            }
            RingOp::DeliverCopied(len) => {
                out.push(3);
                out.extend_from_slice(&len.to_le_bytes());
            }
            RingOp::DeliverTooLong => out.push(4),
            RingOp::DeliverUnreachable => out.push(5),
            RingOp::Reap => out.push(6),
            RingOp::Shut => out.push(7),
            RingOp::Close(side) => out.extend_from_slice(&[8, side as u8]),
            RingOp::Scribble(bytes) => {
                out.push(9);
                put_bytes(out, bytes);
            }
        }
    }
}

/// What the model expects a delivery's result to read as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Delivery {
    Filled(Filled),
    Inline(Vec<u8>),
}

/// The fuzzed direction as the model sees it.
#[derive(Debug, Default)]
struct RingModel {
    /// Receives posted and not reaped, oldest first, with the delivery made into each.
    outstanding: VecDeque<(PostedBuffer, Option<Delivery>)>,
    /// Receives posted, ever.
    posted: u64,
    /// Receives reaped, ever.
    reaped: u64,
    /// Receives delivered into, ever: the sender's next is this one.
    delivered: u64,
    /// The gate was shut.
    shut: bool,
    /// The first close, by which side.
    closed_by: Option<usize>,
}

/// The input as a depth byte and the steps on a ring of that depth (module documentation).
fn run_ring(data: &[u8]) {
    let mut input = Reader::new(data);
    let Some(depth) = input.u8() else {
        return;
    };
    let size = RingSize::of_depth(u32::from(depth) % ENTRIES as u32 + 1);
    let mut segment = Segment::<ENTRIES>::new_boxed();
    let mut view = PostedView::default();
    // `None` once a scribble has left the model behind.
    let mut model = Some(RingModel::default());
    let mut counts = RingModel::default();
    while let Some(op) = RingOp::read(&mut input) {
        if let RingOp::Scribble(bytes) = op {
            scribble(&mut segment, bytes);
            model = None;
            continue;
        }
        match &mut model {
            Some(model) => step(&segment, size, &mut view, model, op),
            None => step_unmodelled(&segment, size, &mut view, &mut counts, op),
        }
    }
}

/// Whether the sender may copy into the receiver's buffers now, as the model says.
fn gate_open(model: &RingModel) -> bool {
    !model.shut && model.closed_by.is_none()
}

/// The parts of `message` cut at `cuts`.
fn parts(message: &[u8], cuts: [u8; 2]) -> [&[u8]; 3] {
    let at = |cut: u8| usize::from(cut) % (message.len() + 1);
    let (first, second) = (at(cuts[0]).min(at(cuts[1])), at(cuts[0]).max(at(cuts[1])));
    [
        &message[..first],
        &message[first..second],
        &message[second..],
    ]
}

/// A step the model follows: carries out `op` and checks what it reads against the model.
fn step(
    segment: &Segment<ENTRIES>,
    size: RingSize,
    view: &mut PostedView,
    model: &mut RingModel,
    op: RingOp<'_>,
) {
    let ring = segment.ring(SENDER, size);
    match op {
        RingOp::Post(buffer) => {
            // The receiver keeps at most the ring's size posted and not reaped.
            if (model.outstanding.len() as u64) < size.entries() {
                ring.post(model.posted, buffer);
                model.outstanding.push_back((buffer, None));
                model.posted += 1;
            }
        }
        RingOp::Look => {
            let expected = model
                .delivered
                .checked_sub(model.reaped)
                .and_then(|index| model.outstanding.get(index as usize))
                .map(|(buffer, _)| *buffer);
            let posted = ring.posted(model.delivered, view);
            assert_eq!(posted, Ok(expected), "an honest receiver's posted count");
            if let Ok(Some(buffer)) = posted
                && view.holds_inline(model.delivered)
            {
                assert!(
                    buffer.len as usize >= INLINE_CAPACITY,
                    "a receive of {} bytes shown to hold any inline message",
                    buffer.len
                );
            }
        }
        RingOp::DeliverInline { .. }
        | RingOp::DeliverCopied(_)
        | RingOp::DeliverTooLong
        | RingOp::DeliverUnreachable => {
            let index = (model.delivered - model.reaped) as usize;
            if index >= model.outstanding.len() {
                return;
            }
            let passed = segment.begin_copy(SENDER);
            assert_eq!(passed, gate_open(model), "the gate");
            if !passed {
                return;
            }
            let delivery = match op {
                RingOp::DeliverInline { message, cuts } => {
                    let message = &message[..message.len().min(INLINE_CAPACITY)];
                    let _parked = ring.deliver_inline(model.delivered, &parts(message, cuts));
                    Delivery::Inline(message.to_vec())
                }
                RingOp::DeliverCopied(len) => {
                    let _parked = ring.deliver(model.delivered, Filled::Delivered(len));
                    Delivery::Filled(Filled::Delivered(len))
                }
                RingOp::DeliverTooLong => {
                    let _parked = ring.deliver(model.delivered, Filled::TooLong);
                    Delivery::Filled(Filled::TooLong)
                }
                _ => {
                    let _parked = ring.deliver(model.delivered, Filled::Unreachable);
                    Delivery::Filled(Filled::Unreachable)
                }
            };
            model.outstanding[index].1 = Some(delivery);
            model.delivered += 1;
        }
        RingOp::Reap => {
            let Some((_, delivery)) = model.outstanding.front() else {
                return;
            };
            let count = model.reaped;
            match delivery {
                None => assert_eq!(ring.delivered(count), None, "a result before delivery"),
                Some(Delivery::Filled(filled)) => {
                    assert_eq!(ring.delivered(count), Some(Ok(*filled)));
                }
                Some(Delivery::Inline(message)) => {
                    assert_eq!(
                        ring.delivered(count),
                        Some(Ok(Filled::Inline(message.len() as u32)))
                    );
                    let mut read = vec![0xEE; message.len()];
                    ring.inline_message(count, &mut read);
                    assert_eq!(&read, message, "an inline message");
                }
            }
            if delivery.is_some() {
                model.outstanding.pop_front();
                model.reaped += 1;
            }
        }
        RingOp::Shut => {
            segment.shut_incoming(RECEIVER, || false);
            model.shut = true;
            assert!(
                !segment.begin_copy(SENDER),
                "a shut gate let a copy through"
            );
        }
        RingOp::Close(side) => {
            segment.close(side);
            let first = *model.closed_by.get_or_insert(side);
            assert_eq!(segment.state(), PairState::ClosedBy(first));
        }
        RingOp::Scribble(_) => unreachable!("scribbles leave the model"),
    }
}

/// A step after a scribble: the segment holds whatever the peer wrote, so only the forms
/// of what is read are checked. `counts` keeps the receive counts going.
fn step_unmodelled(
    segment: &Segment<ENTRIES>,
    size: RingSize,
    view: &mut PostedView,
    counts: &mut RingModel,
    op: RingOp<'_>,
) {
    let ring = segment.ring(SENDER, size);
    let _ = segment.state();
    match op {
        RingOp::Post(buffer) => {
            ring.post(counts.posted, buffer);
            counts.posted += 1;
        }
        RingOp::Look => {
            let _ = ring.posted(counts.delivered, view);
        }
        RingOp::DeliverInline { message, cuts } => {
            if segment.begin_copy(SENDER) {
                let message = &message[..message.len().min(INLINE_CAPACITY)];
                let _parked = ring.deliver_inline(counts.delivered, &parts(message, cuts));
            }
            counts.delivered += 1;
        }
        RingOp::DeliverCopied(_) | RingOp::DeliverTooLong | RingOp::DeliverUnreachable => {
            if segment.begin_copy(SENDER) {
                let _parked = ring.deliver(counts.delivered, Filled::TooLong);
            }
            counts.delivered += 1;
        }
        RingOp::Reap => {
            match ring.delivered(counts.reaped) {
                Some(Ok(Filled::Inline(len))) if len as usize <= INLINE_CAPACITY => {
                    let mut read = vec![0; len as usize];
                    ring.inline_message(counts.reaped, &mut read);
                }
                Some(Err(code)) => assert!(!(0..=4).contains(&code), "known code {code}"),
                _ => {}
            }
            counts.reaped += 1;
        }
        RingOp::Shut => segment.shut_incoming(RECEIVER, || false),
        RingOp::Close(side) => segment.close(side),
        RingOp::Scribble(_) => unreachable!("scribbles are applied by the caller"),
    }
}

/// Overwrites every byte of `segment` with `bytes`, repeated, as a peer process that
/// maps the segment may.
fn scribble(segment: &mut Segment<ENTRIES>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let base = (segment as *mut Segment<ENTRIES>).cast::<u8>();
    for (offset, &byte) in (0..size_of::<Segment<ENTRIES>>()).zip(bytes.iter().cycle()) {
        // SAFETY: `offset` lies inside the segment, which this function borrows mutably, so
        // no other reference reads it meanwhile. Every field of a segment is an atomic
        // integer (its documentation), for which any bytes are a valid value, and padding
        // takes any bytes: after this the segment is valid, holding what a peer wrote.
        unsafe { base.add(offset).write(byte) };
    }
}

/// The seeds: each record a connection sends, and a ring's life with every kind of
/// delivery, a shut gate and a close.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let names = [
        "record_hello",
        "record_welcome",
        "record_refuse_segment",
        "record_refuse_depth",
        "record_refuse_full",
        "record_announce",
        "record_forget",
        "record_wake",
    ];
    let mut seeds: Vec<(&'static str, Vec<u8>)> = names
        .into_iter()
        .zip(ShmRecord::examples())
        .map(|(name, record)| {
            let mut input = vec![0];
            input.extend_from_slice(&record.encode());
            (name, input)
        })
        .collect();
    let buffer = |len| {
        RingOp::Post(PostedBuffer {
            remote_key: 3,
            addr: 0x7f00_0000_2000,
            len,
        })
    };
    let message: Vec<u8> = (1..=80).collect();
    let ring = |depth: u8, ops: &[RingOp<'_>]| {
        let mut input = vec![1, depth];
        for op in ops {
            op.write(&mut input);
        }
        input
    };
    seeds.push((
        "ring_deliveries",
        ring(
            3,
            &[
                buffer(128),
                buffer(128),
                buffer(4096),
                RingOp::Look,
                RingOp::DeliverInline {
                    message: &message,
                    cuts: [16, 40],
                },
                RingOp::Look,
                RingOp::DeliverCopied(4000),
                RingOp::Reap,
                RingOp::Reap,
                RingOp::DeliverTooLong,
                RingOp::Reap,
                buffer(64),
                RingOp::DeliverUnreachable,
                RingOp::Reap,
                RingOp::Look,
                RingOp::Reap,
            ],
        ),
    ));
    seeds.push((
        "ring_shut_and_close",
        ring(
            1,
            &[
                buffer(128),
                RingOp::DeliverInline {
                    message: b"short",
                    cuts: [2, 2],
                },
                RingOp::Reap,
                buffer(128),
                RingOp::Shut,
                RingOp::DeliverCopied(10),
                RingOp::Reap,
                RingOp::Close(1),
                RingOp::Close(0),
            ],
        ),
    ));
    seeds.push((
        "ring_scribbled",
        ring(
            7,
            &[
                buffer(128),
                RingOp::Scribble(&[4, 0, 0, 0, 0x40, 0, 0, 0, 0xFF]),
                RingOp::Look,
                RingOp::Reap,
                RingOp::Reap,
                buffer(128),
                RingOp::DeliverInline {
                    message: &message,
                    cuts: [1, 79],
                },
                RingOp::Reap,
            ],
        ),
    ));
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ring seed reads as steps that write back to its bytes, so the seeds hold the
    /// steps they were written as.
    #[test]
    fn the_ring_seeds_read_back_as_written() {
        let rings: Vec<_> = seeds()
            .into_iter()
            .filter(|(_, seed)| seed[0] % 2 == 1)
            .collect();
        assert!(!rings.is_empty());
        for (name, seed) in rings {
            let mut input = Reader::new(&seed[2..]);
            let mut again = seed[..2].to_vec();
            while let Some(op) = RingOp::read(&mut input) {
                op.write(&mut again);
            }
            assert_eq!(again, seed, "{name}");
        }
    }
}
