//! The sending side of [`ConnectionCore`]: messages offered by copy, borrowed from the
//! caller, or copied by the provider from the caller's memory; whole frames and segments.
//!
//! # Invariants
//!
//! - Where bytes come from is said once, by the call that has them: a [`Source`] for an
//!   offered message, a [`Payload`] for each frame. Nothing below a call guesses it.
//! - Whether a message goes whole or in segments is the tier controller's plan; this side
//!   only frames it. A frame is no longer than the receive its credit stands for, nor than
//!   this side's send slot. The one exception is the small message's path
//!   (`send_at_once`): a message the smallest tier carries whole is whole on every tier,
//!   so it needs no plan; it takes a credit as any frame does.
//! - A segmented message holds the send order: until its last segment is posted, nothing
//!   else is accepted ([`WouldBlock::SegmentedInFlight`]). An owned one is posted by
//!   progress as credits allow; a borrowed one only by the caller offering its rest.
//! - A frame to be copied from the caller's message ([`Post::SendFrom`]) is queued with
//!   its send slot reserved and unwritten, and is posted or written into that slot before
//!   the call that has the message returns (`transmit.rs`); on the small message's path it
//!   is offered before anything is taken for it, and is either posted or left whole to
//!   the general path.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use tierbuf_tiers::controller::{Framing, SendPlan};
use tierbuf_tiers::{OwnedTierCache, OwnedTierSlot};

use super::core::ConnectionCore;
use super::errors::{ConnectionError, SendError, WouldBlock};
use super::header::{FrameHeader, HEADER_LEN};
use super::transmit::{Post, Queued, Transmit};
use crate::error::PostError;
use crate::provider::{BufferRef, CallerCopies};

/// A message in flight as segments.
pub(super) struct Outbox {
    message: OutboxBytes,
    /// Bytes of it already posted.
    sent: usize,
}

/// Where a segmented message's bytes are.
enum OutboxBytes {
    /// Copied when it was offered; progress posts the segments as credits allow.
    Owned(Vec<u8>),
    /// Left with the caller, who offers the rest of this many bytes again until all are
    /// posted.
    Borrowed(usize),
}

impl Outbox {
    fn len(&self) -> usize {
        match &self.message {
            OutboxBytes::Owned(bytes) => bytes.len(),
            OutboxBytes::Borrowed(len) => *len,
        }
    }
}

/// Where an offered message's bytes are, and so how its frames are posted.
#[derive(Clone, Copy)]
enum Source<'m> {
    /// Parts to copy: a whole frame is written into a send slot (or, of one part and a
    /// length `copies` takes, copied by the provider from it), a segmented message is
    /// copied into an owned outbox.
    Copy {
        parts: &'m [IoSlice<'m>],
        copies: CallerCopies,
    },
    /// One slice left with the caller, who offers the rest again until all is posted;
    /// frames of a length `copies` takes are copied by the provider straight from it.
    Borrow {
        message: &'m [u8],
        copies: CallerCopies,
    },
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Copy { parts, .. } => parts.iter().map(|part| part.len()).sum(),
            Source::Borrow { message, .. } => message.len(),
        }
    }
}

/// Where one frame's payload is.
#[derive(Clone, Copy)]
pub(super) enum Payload<'m> {
    /// No payload: a credit or drain frame.
    Empty,
    /// Bytes to copy into the send slot.
    Bytes(&'m [u8]),
    /// Parts to copy into the send slot, one after another.
    Parts(&'m [IoSlice<'m>]),
    /// Whole messages to write as the entries of a packed frame.
    Packed(&'m [&'m [u8]]),
    /// The frame's bytes at `at` of the caller's `message`: copied by the provider from
    /// there when `copies` takes the frame's length, else into the send slot.
    Caller {
        message: &'m [u8],
        at: usize,
        copies: CallerCopies,
    },
}

impl ConnectionCore {
    /// Offers one message given in parts, without blocking: all of it is accepted, as one
    /// message (whole if it fits the tier in force, else copied and sent in segments while
    /// a larger tier is asked for), or none of it; then posts what it can through `to`,
    /// as [`ConnectionCore::try_send_some`] does (a message of one part whose frame `to`
    /// takes from the caller's memory is offered to it as a [`Post::SendFrom`](super::Post::SendFrom)).
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`] when nothing could be taken now; [`SendError::TooLong`];
    /// [`SendError::Failed`].
    pub fn try_send(
        &mut self,
        now: Instant,
        parts: &[IoSlice<'_>],
        to: &mut impl Transmit,
    ) -> Result<(), SendError> {
        let copies = to.takes_from_caller();
        if let [one] = parts
            && let Some(sent) = self.send_at_once(one, copies, to)
        {
            return sent;
        }
        let accepted = self.offer(now, Source::Copy { parts, copies }, false);
        let lies_in = match parts {
            [one] => &one[..],
            _ => &[],
        };
        self.transmit_from(to, lies_in);
        accepted.map(drop)
    }

    /// The small message's path ([`ConnectionCore::try_send`], and
    /// [`ConnectionCore::try_send_some`] of a new message): a message the smallest tier
    /// carries whole, offered with nothing queued ahead of it and no negotiation to pump,
    /// to a transmitter that takes its frame from the caller's memory, is offered at once
    /// as a [`Post::SendFrom`], and its credit, grant and send id are taken only once it
    /// is posted. Such a message plans nothing (it fits every tier and tells the demotion
    /// tracker nothing: `TierController::needs_clock`), so it needs neither the tier
    /// controller nor a send slot, and never meets the work queue. `None` leaves the
    /// message, untouched, to the general path: no credit now, the transmitter declined or
    /// is full, or the message is not such a message. Measured by
    /// `benches/examples/message_instructions` (`docs/transport.md`).
    // Inlined into both callers: as a call of its own it cost a 64 B message about 70
    // instructions more (`benches/examples/message_instructions`, mode `whole`).
    #[inline(always)]
    fn send_at_once(
        &mut self,
        message: &[u8],
        copies: CallerCopies,
        to: &mut impl Transmit,
    ) -> Option<Result<(), SendError>> {
        let len = message.len();
        if self.failed.is_some()
            || self.outbox.is_some()
            || !self.work.is_empty()
            || self.tiers.needs_clock(len)
            || self.tiers.has_transmit()
            || !copies.takes(HEADER_LEN + len)
            || len as u64 > self.config.max_message_len()
        {
            return None;
        }
        self.frame_credit(len, true)?;
        let mut header = FrameHeader::whole(len);
        header.grant = self.grants.peek();
        let mut encoded = [0u8; HEADER_LEN];
        header.encode(&mut encoded);
        let wr_id = self.sending.vacant_key() as u64;
        let post = Post::SendFrom {
            wr_id,
            header: &encoded,
            payload: message,
        };
        match to.post(post) {
            Ok(true) => {}
            Ok(false) | Err(PostError::QueueFull { .. }) => return None,
            Err(error) => {
                let failure = to.refused(error);
                return Some(Err(self.fail_send(failure)));
            }
        }
        self.sending.insert(None);
        self.credits.take();
        self.grants.take();
        self.stats.frames_sent += 1;
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += len as u64;
        Some(Ok(()))
    }

    /// Writes an I/O vector into the connection as a byte stream writes, without blocking,
    /// by the prefix rule (`docs/policy.md`, "I/O vectors"): the longest prefix of whole
    /// elements that fits the tier in force goes out as one message, and the bytes it
    /// carries are returned (write the rest with another call). When the first element
    /// with any bytes does not fit on its own, that element goes out as one message in
    /// segments, at once, while a larger tier is asked for, and its bytes (with any empty
    /// elements before it) are returned. Message boundaries are this call's to choose:
    /// for messages, use [`ConnectionCore::try_send`].
    ///
    /// # Errors
    ///
    /// As [`ConnectionCore::try_send`].
    pub fn try_write_vectored(
        &mut self,
        now: Instant,
        parts: &[IoSlice<'_>],
    ) -> Result<usize, SendError> {
        self.offer(
            now,
            Source::Copy {
                parts,
                copies: CallerCopies::NONE,
            },
            true,
        )
    }

    /// Offers several messages at once, without blocking, each to arrive as a message of
    /// its own, in order; returns how many of them, from the first, were accepted. Runs of
    /// small messages (those the smallest tier carries whole) share frames: as many as
    /// the next credit's receive holds go into one packed frame, so the peer takes them for
    /// the price of one receive. The tier controller plans the leading run as one message
    /// of its packed length: a run longer than the smallest tier holds asks for the tier
    /// that holds it (and tells the demotion tracker it is needed), so a caller that keeps
    /// handing over large batches gets larger frames, and more messages a frame. A message that shares no frame is offered alone, as
    /// [`ConnectionCore::try_send`] offers it (whole, or in segments while a larger
    /// tier is asked for, which ends the call). A message sent alone is not delayed to
    /// wait for others: packing only gathers what is given at once.
    ///
    /// # Errors
    ///
    /// As [`ConnectionCore::try_send`], for the first message: once one message is
    /// accepted, what stops the call is the next call's to report.
    pub fn try_send_batch(&mut self, now: Instant, messages: &[&[u8]]) -> Result<usize, SendError> {
        self.check_failed()?;
        if messages.is_empty() {
            return Ok(0);
        }
        if self.outbox.is_some() {
            self.relieve_receives();
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        // The leading run of small messages is one need of the tier controller, as one
        // message of its packed length would be: it asks for a larger tier where the run
        // does not fit the smallest tier whole, and keeps it while such runs come.
        let run = super::packed::run_len(messages, |len| !self.tiers.needs_clock(len));
        if self.tiers.needs_clock(run) {
            self.tiers
                .plan_message(now, run)
                .map_err(|error| self.fail_send(ConnectionError::of_controller(error)))?;
        }
        if self.tiers.has_transmit() {
            self.pump_control(now);
            self.check_failed()?;
        }
        let mut taken = 0;
        while taken < messages.len() && self.outbox.is_none() {
            let rest = &messages[taken..];
            let sent = match self.frame_room() {
                Some(room) => {
                    match super::packed::pack(rest, room, |len| !self.tiers.needs_clock(len)) {
                        (count @ 2.., bytes) => self.send_packed(&rest[..count], bytes),
                        _ => self.send_one(now, rest[0]),
                    }
                }
                None => self.send_one(now, rest[0]),
            };
            match sent {
                Ok(count) => taken += count,
                Err(error) if taken == 0 => return Err(error),
                Err(_) => break,
            }
        }
        Ok(taken)
    }

    /// The payload bytes the next frame may take: what the next credit's receive and this
    /// side's send slot both hold; none without a credit.
    fn frame_room(&mut self) -> Option<usize> {
        let credit_tier = self.credits.next_tier()?;
        let capacity = self.config.capacity();
        let own_slot = capacity.frame(self.tiers.send_buffers_tier()).unwrap_or(0);
        let room = capacity
            .frame(tierbuf_tiers::TierIndex::new(credit_tier))
            .unwrap_or(0);
        Some(room.min(own_slot))
    }

    /// Posts `messages` as one packed frame of `bytes` payload bytes; returns their count.
    fn send_packed(&mut self, messages: &[&[u8]], bytes: usize) -> Result<usize, SendError> {
        let header = FrameHeader::packed(bytes, messages.len());
        if !self.post_frame(header, Payload::Packed(messages), true) {
            self.relieve_receives();
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        self.stats.messages_sent += messages.len() as u64;
        self.stats.messages_packed += messages.len() as u64;
        self.stats.bytes_sent += messages
            .iter()
            .map(|message| message.len() as u64)
            .sum::<u64>();
        Ok(messages.len())
    }

    /// Offers one message of a batch alone; returns 1 once it is accepted.
    fn send_one(&mut self, now: Instant, message: &[u8]) -> Result<usize, SendError> {
        let parts = &[IoSlice::new(message)];
        let copies = CallerCopies::NONE;
        self.offer(now, Source::Copy { parts, copies }, false)
            .map(|_| 1)
    }

    /// Offers a message in one slice that is not copied if it has to be segmented, and
    /// posts what it can through `to` before it returns: the frames are posted straight
    /// from `rest` as credits and send slots allow, and the bytes posted are returned; the
    /// caller offers the rest (`&rest[accepted..]`) in later calls until all of it is
    /// posted. Until then the message holds the send order: the other sends and
    /// [`ConnectionCore::try_reserve`] report [`WouldBlock::SegmentedInFlight`], and the
    /// core's progress does not post its segments (it does not have the bytes). A call
    /// that offers anything but the rest fails with [`SendError::NotTheRest`]; one that
    /// can post nothing now reports [`WouldBlock::NoCredit`] (offer the same rest again).
    /// A message sent in one frame is posted whole.
    ///
    /// Frames of the lengths `to` takes from the caller's memory
    /// ([`Transmit::takes_from_caller`]) are offered to it as [`Post::SendFrom`](super::Post::SendFrom), for a
    /// provider that copies them straight from `rest` into the peer's receives (saving
    /// the copy into a send slot); those it does not take are written into their slots
    /// before the call returns. Nothing refers to `rest` after it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Instant;
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// use tierbuf_transport::{CallerCopies, PostError};
    /// use tierbuf_transport::connection::{ConnectionConfig, ConnectionCore, Post, Transmit};
    ///
    /// /// Copies frames of 4 KiB and more from the caller, as a provider of shared memory
    /// /// may; posts everything else.
    /// #[derive(Default)]
    /// struct Copier(Vec<Vec<u8>>);
    /// impl Transmit for Copier {
    ///     fn post(&mut self, post: Post<'_>) -> Result<bool, PostError> {
    ///         if let Post::SendFrom { header, payload, .. } = post {
    ///             self.0.push([header, payload].concat());
    ///         }
    ///         Ok(true)
    ///     }
    ///     fn takes_from_caller(&self) -> CallerCopies {
    ///         CallerCopies::new(None, Some(4096))
    ///     }
    /// }
    ///
    /// let ladder = TierLadder::builder().tier(8192, 4, 8000).build()?;
    /// let config = Arc::new(ConnectionConfig::new(Arc::new(ladder))?);
    /// let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(1 << 20)));
    /// let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
    /// let now = Instant::now();
    /// let mut core = ConnectionCore::new(config, Arc::clone(&reservoir), reservoir, now)?;
    /// let mut copier = Copier::default();
    /// core.transmit(&mut copier); // the first receives
    ///
    /// let message = vec![7u8; 4096];
    /// assert_eq!(core.try_send_some(now, &message, &mut copier)?, message.len());
    /// assert_eq!(copier.0.len(), 1, "one frame, copied from the message");
    /// assert!(copier.0[0].ends_with(&message));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ConnectionCore::try_send`], and [`SendError::NotTheRest`].
    pub fn try_send_some(
        &mut self,
        now: Instant,
        rest: &[u8],
        to: &mut impl Transmit,
    ) -> Result<usize, SendError> {
        let copies = to.takes_from_caller();
        if self.outbox.is_none()
            && let Some(sent) = self.send_at_once(rest, copies, to)
        {
            return sent.map(|()| rest.len());
        }
        let accepted = self.send_borrowed(now, rest, copies);
        self.transmit_from(to, rest);
        accepted
    }

    fn send_borrowed(
        &mut self,
        now: Instant,
        message: &[u8],
        copies: CallerCopies,
    ) -> Result<usize, SendError> {
        self.check_failed()?;
        let accepted = match &self.outbox {
            Some(Outbox {
                message: OutboxBytes::Borrowed(len),
                sent,
            }) => {
                let rest = len - sent;
                if message.len() != rest {
                    return Err(SendError::NotTheRest {
                        expected: rest,
                        offered: message.len(),
                    });
                }
                self.post_borrowed_segments(message, copies)
            }
            _ => self.offer(now, Source::Borrow { message, copies }, false)?,
        };
        if accepted == 0 && !message.is_empty() {
            // A segmented message taken on with no segment posted yet: offer it again.
            self.relieve_receives();
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        Ok(accepted)
    }

    /// Bytes posted of a message offered by [`ConnectionCore::try_send_some`] whose
    /// rest the caller still owes, if there is one. One with none posted yet is dropped
    /// (nothing of it is on the wire): `Some(0)` then, and the send order is free again.
    pub fn withdraw_unsent(&mut self) -> Option<usize> {
        match &self.outbox {
            Some(Outbox {
                message: OutboxBytes::Borrowed(_),
                sent,
            }) => {
                let sent = *sent;
                if sent == 0 {
                    self.outbox = None;
                }
                Some(sent)
            }
            _ => None,
        }
    }

    pub(super) fn check_failed(&self) -> Result<(), SendError> {
        match &self.failed {
            Some(error) => Err(SendError::Failed(Arc::clone(error))),
            None => Ok(()),
        }
    }

    /// Fails the connection with `error` and returns it as a send's error.
    pub(super) fn fail_send(&mut self, error: ConnectionError) -> SendError {
        SendError::Failed(Arc::clone(self.fail(error)))
    }

    /// Takes an offered message: asks the tier controller for its plan (by the prefix rule
    /// when `prefix`), then sends it whole or starts its segments.
    fn offer(
        &mut self,
        now: Instant,
        source: Source<'_>,
        prefix: bool,
    ) -> Result<usize, SendError> {
        self.check_failed()?;
        let total = source.len();
        if total as u64 > self.config.max_message_len() {
            return Err(SendError::TooLong {
                len: total as u64,
                max: self.config.max_message_len(),
            });
        }
        if self.outbox.is_some() {
            self.relieve_receives();
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        let plan = match source {
            Source::Copy { parts, .. } if prefix => self.tiers.plan_io_vector(now, parts),
            // One message of every part.
            Source::Copy { parts, .. } => {
                self.tiers.plan_message(now, total).map(|plan| SendPlan {
                    elements: parts.len(),
                    ..plan
                })
            }
            Source::Borrow { .. } => self.tiers.plan_message(now, total),
        }
        .map_err(|error| self.fail_send(ConnectionError::of_controller(error)))?;
        match plan.framing {
            Framing::Whole => {
                if self.tiers.has_transmit() {
                    self.pump_control(now);
                    self.check_failed()?;
                }
                self.send_whole(source, plan)
            }
            Framing::Segmented => {
                // Exposed for the peer to read where the data path is one-sided, else in
                // segments. The promotion it asked for goes out behind its frame (or the
                // segments the credits in hand allow): the peer takes those before it
                // provisions the tier.
                let one = [IoSlice::new(match source {
                    Source::Borrow { message, .. } => message,
                    Source::Copy { .. } => &[],
                })];
                let (parts, exposed_plan) = match source {
                    Source::Copy { parts, .. } => (parts, plan),
                    Source::Borrow { .. } => (
                        &one[..],
                        SendPlan {
                            elements: 1,
                            ..plan
                        },
                    ),
                };
                let accepted = match self.start_exposed(now, parts, &exposed_plan) {
                    Some(exposed) => exposed,
                    None => Ok(self.start_segmented(now, source, plan)),
                };
                if self.tiers.has_transmit() {
                    // Taken or not, the message asked for the tier: a failure found now is
                    // the next call's to report.
                    self.pump_control(now);
                }
                accepted
            }
        }
    }

    /// Sends the planned prefix of `source` as one whole frame, if a data credit whose
    /// receive holds it and a send slot are free.
    fn send_whole(&mut self, source: Source<'_>, plan: SendPlan) -> Result<usize, SendError> {
        let payload = match source {
            Source::Copy {
                parts: [one],
                copies,
            } if plan.elements == 1 => Payload::Caller {
                message: one,
                at: 0,
                copies,
            },
            Source::Copy { parts, .. } => Payload::Parts(&parts[..plan.elements]),
            Source::Borrow { message, copies } => Payload::Caller {
                message,
                at: 0,
                copies,
            },
        };
        if !self.post_frame(FrameHeader::whole(plan.bytes), payload, true) {
            self.relieve_receives();
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += plan.bytes as u64;
        Ok(plan.bytes)
    }

    /// Takes the planned prefix of `source` on as a segmented message and posts what
    /// credits allow now; returns the bytes accepted (all of a copied message, those
    /// posted of a borrowed one).
    fn start_segmented(&mut self, now: Instant, source: Source<'_>, plan: SendPlan) -> usize {
        self.oversize_at = Some(now);
        self.stats.messages_sent += 1;
        self.stats.messages_segmented += 1;
        self.stats.bytes_sent += plan.bytes as u64;
        match source {
            Source::Borrow { message, copies } => {
                self.outbox = Some(Outbox {
                    message: OutboxBytes::Borrowed(plan.bytes),
                    sent: 0,
                });
                self.post_borrowed_segments(message, copies)
            }
            Source::Copy { parts, .. } => {
                let mut copy = std::mem::take(&mut self.spare_outbox);
                copy.reserve(plan.bytes);
                for part in &parts[..plan.elements] {
                    copy.extend_from_slice(part);
                }
                self.outbox = Some(Outbox {
                    message: OutboxBytes::Owned(copy),
                    sent: 0,
                });
                self.send_segments();
                plan.bytes
            }
        }
    }

    /// Takes `bytes`, a copy of a message already counted as sent, on as a segmented
    /// message, posted by progress as credits allow: a message whose read the peer
    /// refused (`rendezvous.rs`), whose invariants keep the outbox free for it.
    pub(super) fn segment_copy(&mut self, bytes: Vec<u8>) {
        self.stats.messages_segmented += 1;
        self.outbox = Some(Outbox {
            message: OutboxBytes::Owned(bytes),
            sent: 0,
        });
    }

    /// Posts one frame: takes a send slot and a credit (a data credit when `data`), writes
    /// the header (with the oldest pending grant) and the payload, and queues the send; or
    /// hands the frame out for the provider to copy from the caller's memory. Returns
    /// false, consuming nothing, when no slot or credit is free or the payload does not
    /// fit.
    pub(super) fn post_frame(
        &mut self,
        header: FrameHeader,
        payload: Payload<'_>,
        data: bool,
    ) -> bool {
        let len = header.payload_len as usize;
        if self.frame_credit(len, data).is_none() {
            return false;
        }
        let Some(mut slot) = self.acquire_send_slot(HEADER_LEN + len) else {
            return false;
        };
        let body = &mut slot[HEADER_LEN..HEADER_LEN + len];
        match payload {
            Payload::Empty => {}
            Payload::Bytes(bytes) => body.copy_from_slice(bytes),
            Payload::Parts(parts) => {
                let mut at = 0;
                for part in parts {
                    body[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
            }
            Payload::Packed(messages) => super::packed::write_entries(body, messages),
            Payload::Caller { at, copies, .. } if copies.takes(HEADER_LEN + len) => {
                self.post_copied(header, slot, at);
                return true;
            }
            Payload::Caller { message, at, .. } => body.copy_from_slice(&message[at..at + len]),
        }
        self.post_slot(header, slot);
        true
    }

    /// The tier of the credit a frame of `len` payload bytes would take (a data credit
    /// when `data`), if one is free and its receive holds the frame. A frame that is not
    /// data takes the last credit only if it carries a grant: two sides whose last
    /// credits crossed in frames that granted nothing would be left with none each,
    /// holding receives they could never grant (`docs/connection.md`, rule 3).
    pub(super) fn frame_credit(&self, len: usize, data: bool) -> Option<u8> {
        let usable = if data {
            self.credits.has_data_credit()
        } else {
            self.credits.total() > 1 || (self.credits.total() == 1 && self.grants.total() > 0)
        };
        let capacity = self.config.capacity();
        self.credits.next_tier().filter(|&tier| {
            usable
                && capacity
                    .frame(tierbuf_tiers::TierIndex::new(tier))
                    .is_some_and(|room| len <= room)
        })
    }

    /// Takes the credit [`ConnectionCore::frame_credit`] found, writes `header` (with the
    /// oldest pending grant) into `slot`, whose payload is in place, and queues the send.
    pub(super) fn post_slot(&mut self, mut header: FrameHeader, mut slot: OwnedTierSlot) {
        let len = header.payload_len as usize;
        self.credits.take();
        header.grant = self.grants.take();
        header.encode(&mut slot[..HEADER_LEN]);
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: (HEADER_LEN + len) as u32,
        };
        let wr_id = self.sending.insert(Some(slot)) as u64;
        self.work.push_back(Queued::Send { wr_id, buffer });
        self.stats.frames_sent += 1;
    }

    /// [`ConnectionCore::post_slot`] for a frame the provider may copy from the caller's
    /// message, where its payload starts at `payload_at`: takes the credit, encodes the
    /// header, and queues the frame with `slot` reserved, unwritten, for it (`transmit.rs`,
    /// module invariants).
    fn post_copied(&mut self, mut header: FrameHeader, slot: OwnedTierSlot, payload_at: usize) {
        self.credits.take();
        header.grant = self.grants.take();
        let mut encoded = [0u8; HEADER_LEN];
        header.encode(&mut encoded);
        let wr_id = self.sending.insert(None) as u64;
        self.work.push_back(Queued::SendFrom {
            wr_id,
            header: encoded,
            payload_at,
            payload_len: header.payload_len as usize,
            slot,
        });
        self.stats.frames_sent += 1;
    }

    /// Keeps a send slot for the next frame if it lies in the send tier in force; gives it
    /// back to its pool otherwise.
    pub(super) fn keep_send_slot(&mut self, slot: OwnedTierSlot) {
        if !self.shares_send_slots && self.tiers.holds_send_slot(&slot) {
            self.spare_send_slots.push(slot);
        }
    }

    /// A view of the send region for a [`Sender`](super::Sender) on another thread; from
    /// now on completed send slots go back to their pool, where senders find them.
    pub(crate) fn share_send_slots(&mut self) -> OwnedTierCache {
        self.shares_send_slots = true;
        self.spare_send_slots.clear();
        self.tiers.send_cache()
    }

    /// A send slot of at least `len` bytes: from the send tier in force, or, while that is
    /// too small (its promotion refused for memory), none.
    pub(super) fn acquire_send_slot(&mut self, len: usize) -> Option<OwnedTierSlot> {
        let slot = match self.spare_send_slots.pop() {
            Some(slot) => slot,
            None => self.tiers.send_slot()?,
        };
        (slot.len() >= len).then_some(slot)
    }

    /// Sends as many segments of an owned outbox as credits allow.
    pub(super) fn send_segments(&mut self) {
        let Some(Outbox {
            message: OutboxBytes::Owned(bytes),
            sent,
        }) = self
            .outbox
            .take_if(|outbox| matches!(outbox.message, OutboxBytes::Owned(_)))
        else {
            return;
        };
        let total = bytes.len();
        let sent = sent + self.post_segments(&bytes, sent, total, CallerCopies::NONE);
        if sent < total {
            self.outbox = Some(Outbox {
                message: OutboxBytes::Owned(bytes),
                sent,
            });
        } else if bytes.capacity() <= self.config.spare_buffer_limit() {
            let mut spare = bytes;
            spare.clear();
            self.spare_outbox = spare;
        }
    }

    /// Posts segments of the borrowed outbox from `rest`, its bytes not yet posted, as
    /// credits allow; returns how many bytes were posted.
    fn post_borrowed_segments(&mut self, rest: &[u8], copies: CallerCopies) -> usize {
        let Some(outbox) = &self.outbox else {
            return 0;
        };
        let (sent, total) = (outbox.sent, outbox.len());
        // `rest` starts at byte `sent`: present it as the message, less what is posted.
        let posted = self.post_segments_from(rest, sent, total, copies);
        if sent + posted == total {
            self.outbox = None;
        } else if let Some(outbox) = &mut self.outbox {
            outbox.sent += posted;
        }
        posted
    }

    /// Posts segments of a whole `message` (`total` bytes) of which `sent` are posted.
    fn post_segments(
        &mut self,
        message: &[u8],
        sent: usize,
        total: usize,
        copies: CallerCopies,
    ) -> usize {
        self.post_segments_from(&message[sent..], sent, total, copies)
    }

    /// Posts segments of a `total`-byte message of which `sent` bytes are posted, from
    /// `rest` (the bytes after those), while credits and send slots allow; returns how
    /// many bytes it posted.
    fn post_segments_from(
        &mut self,
        rest: &[u8],
        sent: usize,
        total: usize,
        copies: CallerCopies,
    ) -> usize {
        let mut posted = 0;
        while sent + posted < total {
            let Some(room) = self.frame_room() else {
                break;
            };
            let remaining = total - sent - posted;
            // A first segment leaves at least one byte for a later one: a message that
            // fits one frame goes out whole, never as a lone first segment.
            let chunk = if sent + posted == 0 {
                remaining.min(room).min(remaining - 1)
            } else {
                remaining.min(room)
            };
            let header = FrameHeader::segment(sent + posted, chunk, total);
            let payload = Payload::Caller {
                message: rest,
                at: posted,
                copies,
            };
            if chunk == 0 || !self.post_frame(header, payload, true) {
                break;
            }
            posted += chunk;
        }
        posted
    }
}
