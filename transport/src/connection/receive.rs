//! The receiving side of [`ConnectionCore`]: posting receives, taking completions, and the
//! delivered [`Message`].

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use tierbuf_tiers::OwnedTierSlot;

use super::control::{ControlFrame, ControlPath};
use super::core::ConnectionCore;
use super::credits::{MIN_POSTED, Urgency};
use super::errors::{ConnectionError, PeerViolation, WorkKind};
use super::header::{FrameHeader, FrameKind, HEADER_LEN};
use super::rendezvous::READ_WR_ID;
use super::returns::{LentBuffer, LentLanding, LentSlot, Node, ReturnedSlots};
use std::marker::PhantomData;

use super::transmit::{Post, Queued, Transmit};
use crate::error::PostError;
use crate::error::QueueKind;
use crate::provider::{BufferRef, Completion, Opcode};
use crate::sync;

impl ConnectionCore {
    /// Whether a delivered message waits to be taken.
    pub(crate) fn has_delivered(&self) -> bool {
        !self.delivered.is_empty()
    }

    /// The next delivered message, in the order the peer sent them.
    ///
    /// A message that arrived in one frame is handed over in its receive slot (zero-copy)
    /// while the user holds few enough others that `MIN_POSTED` receives of its tier can
    /// stay posted; past that it is handed over as a copy and its slot is posted again
    /// ([`ConnectionStats::messages_copied_to_keep_receives`](super::ConnectionStats)); a
    /// tier of no more than `MIN_POSTED` slots hands every message over as a copy.
    /// A user that holds every message it receives while it waits to send (an RPC server
    /// keeping requests until their replies are out, on both sides) would otherwise leave
    /// both peers too few credits to send data, and they would wait for each other.
    pub fn try_recv(&mut self) -> Option<Message> {
        let message = self.delivered.pop_front()?;
        let slot = match &message.body {
            Body::Slot { slot, .. } => slot,
            Body::Shared { slot, .. } => &**slot,
            Body::Copied(_) | Body::Landed(_) => return Some(message),
        };
        let slots = slot
            .tier()
            .and_then(|tier| self.config.ladder().tier(tier))
            .map_or(0, |spec| spec.slot_count());
        // Lent slots not given back: this one, those still queued here, and those the
        // user holds. Only when they crowd the tier are the queued ones counted out.
        let lent_now = self.lent - self.returned.given_back();
        if lent_now + MIN_POSTED as usize > slots {
            let queued = self
                .delivered
                .iter()
                .filter(|queued| queued.lends_its_slot())
                .count();
            let held = lent_now - queued - 1;
            if held + 1 + MIN_POSTED as usize > slots {
                self.stats.messages_copied_to_keep_receives += 1;
                // Dropping the message gives its slot back, to be posted at the next
                // progress.
                return Some(Message::copy_of(&message, &self.returned));
            }
        }
        Some(message)
    }

    /// Copies zero-copy messages still queued for the user out of their receive slots,
    /// oldest first, while fewer than `MIN_POSTED` receives are posted, and posts the
    /// slots again. Run when this side cannot send for want of credits: its user is busy
    /// sending and not reading, and if the peer's user is too, the receives both queues
    /// hold would leave each side too few credits to send data, each waiting for the other.
    ///
    /// A peer decides when this side's sends find credit, so relief is bounded: it copies
    /// nothing while the unread messages held as copies reach the configured
    /// [`unread_copy_limit`](super::ConnectionConfig::unread_copy_limit). Past that the
    /// peer waits for the user to read, as it would without relief.
    pub(super) fn relieve_receives(&mut self) {
        if self.posted.len() >= MIN_POSTED as usize {
            return;
        }
        let unread_copies: usize = self
            .delivered
            .iter()
            .filter(|message| !message.is_zero_copy())
            // Each with its place in the queue, so that copies of empty messages count.
            .map(|message| message.len() + std::mem::size_of::<Message>())
            .sum();
        if unread_copies >= self.config.unread_copy_limit() {
            return;
        }
        let mut freed = 0;
        for message in &mut self.delivered {
            if self.posted.len() + freed >= MIN_POSTED as usize {
                break;
            }
            if message.is_zero_copy() {
                freed += usize::from(message.holds_slot_alone());
                self.stats.messages_copied_to_keep_receives += 1;
                // Replacing the message drops its slot, which goes back to be posted.
                *message = Message::copy_of(message, &self.returned);
            }
        }
        self.repost_returned();
    }

    /// Reposts the receive slots that dropped messages gave back (those of the tier in
    /// force; the others go back to their pools), keeping their nodes to lend again.
    pub(super) fn repost_returned(&mut self) {
        for (slot, node) in self.returned.take_returned() {
            self.spare_nodes.push(node);
            self.recycle(slot, Urgency::Soon);
        }
    }

    /// [`ConnectionCore::repost_returned`], each receive posted straight through `to`
    /// while nothing is queued ahead of it (a steady connection's case, which so skips
    /// the work queue) and queued otherwise. Returns how many it posted.
    pub(super) fn repost_returned_through(&mut self, to: &mut impl Transmit) -> usize {
        let mut posted = 0;
        for (slot, node) in self.returned.take_returned() {
            self.spare_nodes.push(node);
            if !self.tiers.holds_recv_slot(&slot) {
                continue;
            }
            let (wr_id, buffer) = self.enlist_receive(slot, Urgency::Soon);
            if self.work.is_empty() && self.failed.is_none() {
                let post = Post::Recv {
                    wr_id,
                    buffer,
                    held: PhantomData,
                };
                match to.post(post) {
                    Ok(_) => {
                        posted += 1;
                        continue;
                    }
                    Err(PostError::QueueFull { .. }) => {}
                    Err(error) => {
                        self.work.push_back(Queued::Recv { wr_id, buffer });
                        self.refused(to, error);
                        continue;
                    }
                }
            }
            self.work.push_back(Queued::Recv { wr_id, buffer });
        }
        posted
    }

    /// Posts every free slot of the receive tier in force as a receive.
    pub(super) fn post_receives(&mut self) {
        while let Some(slot) = self.tiers.recv_slot() {
            self.post_receive(slot, Urgency::Soon);
        }
    }

    fn post_receive(&mut self, slot: OwnedTierSlot, urgency: Urgency) {
        let (wr_id, buffer) = self.enlist_receive(slot, urgency);
        self.work.push_back(Queued::Recv { wr_id, buffer });
    }

    /// Takes `slot` on as a receive to post: holds it in `posted` and counts it for the
    /// peer's next grant; returns the request to post.
    fn enlist_receive(&mut self, slot: OwnedTierSlot, urgency: Urgency) -> (u64, BufferRef) {
        let tier = slot.tier().get();
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: slot.len() as u32,
        };
        let wr_id = self.posted.insert(slot) as u64;
        if self.returns_to_lend.len() < self.posted.len() {
            self.returns_to_lend.push(sync::Arc::clone(&self.returned));
        }
        self.grants.posted(tier, 1, urgency);
        (wr_id, buffer)
    }

    /// Reposts a receive slot that came back, unless its tier was replaced (even by a
    /// new registration of the same index); the peer hears of it as `urgency` says.
    pub(super) fn recycle(&mut self, slot: OwnedTierSlot, urgency: Urgency) {
        if self.tiers.holds_recv_slot(&slot) {
            self.post_receive(slot, urgency);
        }
    }

    /// Takes one completion from the provider endpoint, whatever its status.
    ///
    /// A successful one frees or delivers what its request held. After the peer's orderly
    /// close has failed the connection (the driver calls [`ConnectionCore::fail`] with
    /// [`ConnectionError::PeerClosed`] when its endpoint says so), a receive's data frame
    /// is still delivered and a send still stops being outstanding: both reached their
    /// end before the close. One with an error status fails the connection, unless it
    /// failed already, with [`ConnectionError::CompletionFailed`], and takes its request
    /// back as flushed: a send that carried message bytes counts as not delivered.
    ///
    /// # Errors
    ///
    /// The error the connection failed with, now or before.
    pub fn handle_completion(
        &mut self,
        now: Instant,
        completion: &Completion,
    ) -> Result<(), Arc<ConnectionError>> {
        if !completion.status.is_success() {
            return Err(self.handle_unsuccessful(completion));
        }
        if let Some(error) = &self.failed {
            let error = Arc::clone(error);
            self.handle_after_failure(now, completion, &error);
            return Err(error);
        }
        let wr_id = completion.wr_id;
        let outcome = match completion.opcode.queue() {
            QueueKind::Send => match self.sending.try_remove(wr_id as usize) {
                Some(slot) => {
                    // A send copied from the caller's message holds no slot.
                    if let Some(slot) = slot {
                        self.keep_send_slot(slot);
                    }
                    return Ok(());
                }
                // The one read in flight (`rendezvous.rs`) has an id of its own.
                None if wr_id == READ_WR_ID => self.finish_read(completion.byte_len),
                None => Err(ConnectionError::UnknownWorkRequest {
                    kind: WorkKind::Send,
                    wr_id,
                }),
            },
            QueueKind::Recv => match self.posted.try_remove(wr_id as usize) {
                Some(slot) => self.receive(now, slot, completion.byte_len as usize),
                None => Err(ConnectionError::UnknownWorkRequest {
                    kind: WorkKind::Recv,
                    wr_id,
                }),
            },
        };
        if let Err(error) = outcome {
            self.fail(error);
        }
        match &self.failed {
            Some(error) => Err(Arc::clone(error)),
            None => Ok(()),
        }
    }

    /// [`ConnectionCore::handle_completion`] of a completion with an error status: fails
    /// the connection (unless it failed already) and takes the request back.
    #[cold]
    fn handle_unsuccessful(&mut self, completion: &Completion) -> Arc<ConnectionError> {
        let kind = match completion.opcode {
            Opcode::Read => WorkKind::Read,
            opcode if opcode.queue() == QueueKind::Send => WorkKind::Send,
            _ => WorkKind::Recv,
        };
        let wr_id = completion.wr_id;
        let error = Arc::clone(self.fail(ConnectionError::CompletionFailed {
            kind,
            wr_id,
            status: completion.status,
        }));
        self.take_back(kind, wr_id);
        error
    }

    /// [`ConnectionCore::handle_completion`] of a successful completion once the
    /// connection has failed with `error`: after the peer's close, what reached its end
    /// before it still counts.
    #[cold]
    fn handle_after_failure(
        &mut self,
        now: Instant,
        completion: &Completion,
        error: &ConnectionError,
    ) {
        if !matches!(error, ConnectionError::PeerClosed) {
            return;
        }
        let wr_id = completion.wr_id;
        match completion.opcode.queue() {
            QueueKind::Recv => self.receive_before_close(now, wr_id, completion.byte_len as usize),
            // The frame reached the peer before its close: it is not outstanding, so
            // `is_idle` tells whether everything sent arrived. A read that completed
            // delivers nothing after the close (`docs/protocol.md`, "Rendezvous").
            QueueKind::Send if wr_id == READ_WR_ID => self.take_back_read(),
            QueueKind::Send => drop(self.sending.try_remove(wr_id as usize)),
        }
    }

    /// Takes back a request that completed with an error status or will never be posted
    /// (a flush, once the connection is down), freeing its slot; a send that carried message bytes is
    /// remembered as not delivered ([`ConnectionCore::lost_data`]).
    pub(super) fn take_back(&mut self, kind: WorkKind, wr_id: u64) {
        match kind {
            WorkKind::Recv => drop(self.posted.try_remove(wr_id as usize)),
            WorkKind::Read => self.take_back_read(),
            WorkKind::Send => {
                let Some(slot) = self.sending.try_remove(wr_id as usize) else {
                    return;
                };
                // A send copied from the caller's message holds no slot: it was data. A
                // slot holds the whole frame, header and payload.
                let data = slot.as_ref().is_none_or(|slot| {
                    FrameHeader::decode(slot).is_ok_and(|header| header.kind.carries_data())
                });
                self.lost_data |= data;
            }
        }
    }

    /// Whether a send that carried message bytes completed with an error: something
    /// accepted did not reach the peer.
    pub fn lost_data(&self) -> bool {
        self.lost_data
    }

    /// A receive that completed with a frame after the connection failed for the peer's
    /// orderly close. The completions of a poll come in no set order (a send of this
    /// side's flushed by the close may come first), so the close can be found before
    /// frames that landed ahead of it: they carry the peer's last messages, delivered
    /// before the close as a socket's reader gets every byte before its end. Only data
    /// frames, and the peer's word that it read a message this side exposed, are taken;
    /// the connection is over for anything else.
    fn receive_before_close(&mut self, now: Instant, wr_id: u64, len: usize) {
        let Some(slot) = self.posted.try_remove(wr_id as usize) else {
            return;
        };
        // Data, and the answer that says the peer read a message this side exposed: it
        // reached the peer before the close.
        let data = FrameHeader::decode(&slot[..len.min(slot.len())])
            .is_ok_and(|header| header.kind.carries_data() || header.kind == FrameKind::ReadDone);
        if data {
            // A frame that breaks the protocol delivers nothing; the close stays the
            // connection's failure.
            let _ = self.receive(now, slot, len);
        }
    }

    fn receive(
        &mut self,
        now: Instant,
        slot: OwnedTierSlot,
        len: usize,
    ) -> Result<(), ConnectionError> {
        let peer = ConnectionError::PeerProtocol;
        let frame = &slot[..len.min(slot.len())];
        let header =
            FrameHeader::decode(frame).map_err(|error| peer(PeerViolation::Header(error)))?;
        let ladder_len = self.config.ladder().len();
        if usize::from(header.grant.tier) >= ladder_len {
            return Err(peer(PeerViolation::GrantBeyondLadder {
                tier: header.grant.tier,
                len: ladder_len,
            }));
        }
        self.credits.grant(header.grant).map_err(|past| {
            peer(PeerViolation::GrantBeyondReceives {
                tier: header.grant.tier,
                count: header.grant.count,
                held: past.held,
                limit: past.limit,
            })
        })?;
        let payload_len = header.payload_len as usize;
        let payload = &frame[HEADER_LEN..HEADER_LEN + payload_len];
        match header.kind {
            FrameKind::Whole => {
                self.reassembly
                    .check_whole(FrameKind::Whole, header.message_len)
                    .map_err(|error| peer(PeerViolation::Reassembly(error)))?;
                self.stats.messages_received += 1;
                self.stats.bytes_received += payload_len as u64;
                let returns = self
                    .returns_to_lend
                    .pop()
                    .expect("a reference to lend for every posted receive");
                let node = self.spare_nodes.pop().unwrap_or_else(Node::new);
                self.lent += 1;
                self.deliver(Message {
                    body: Body::Slot {
                        slot: ReturnedSlots::lend(returns, slot, node),
                        len: payload_len,
                    },
                });
                return Ok(());
            }
            FrameKind::Packed => {
                let from = self.delivered.len();
                self.receive_packed(header, slot)?;
                self.hold_behind_read(from);
                return Ok(());
            }
            FrameKind::Exposed => {
                self.oversize_at = Some(now);
                self.start_read(header, payload)?;
            }
            FrameKind::ReadDone | FrameKind::ReadRefused => {
                self.peer_answered(header.kind, payload)?;
            }
            FrameKind::First | FrameKind::Middle | FrameKind::Last => {
                self.oversize_at = Some(now);
                let returned = &self.returned;
                let done = self
                    .reassembly
                    .segment(header.kind, header.message_len, payload, |len| {
                        returned.take_buffer(len)
                    })
                    .map_err(|error| peer(PeerViolation::Reassembly(error)))?;
                if let Some(message) = done {
                    self.stats.messages_received += 1;
                    self.stats.bytes_received += message.len() as u64;
                    let message = Message {
                        body: Body::Copied(ReturnedSlots::lend_buffer(&self.returned, message)),
                    };
                    self.deliver_reassembled(message)?;
                }
            }
            FrameKind::Control => match &mut self.control {
                ControlPath::InBand(in_band) => {
                    in_band.incoming.push_back(ControlFrame::new(payload));
                    self.recycle(slot, Urgency::Soon);
                    self.hold_control_behind_message(now);
                    self.pump_control(now);
                    return Ok(());
                }
                ControlPath::External(_) => {
                    return Err(peer(PeerViolation::UnexpectedControlFrame));
                }
            },
            FrameKind::Credit | FrameKind::Drain => {
                self.recycle(slot, Urgency::WithNextFrame);
                return Ok(());
            }
        }
        self.recycle(slot, Urgency::Soon);
        Ok(())
    }
}

impl ConnectionCore {
    /// Delivers the messages of a packed frame, each a view onto the one receive slot
    /// they share, which goes back to be posted once the last of them is dropped. A frame
    /// with a malformed entry delivers none of them.
    fn receive_packed(
        &mut self,
        header: FrameHeader,
        slot: OwnedTierSlot,
    ) -> Result<(), ConnectionError> {
        let peer = ConnectionError::PeerProtocol;
        let returns = self
            .returns_to_lend
            .pop()
            .expect("a reference to lend for every posted receive");
        let node = self.spare_nodes.pop().unwrap_or_else(Node::new);
        self.lent += 1;
        let shared = Arc::new(ReturnedSlots::lend(returns, slot, node));
        let payload = &shared[HEADER_LEN..HEADER_LEN + header.payload_len as usize];
        let queued = self.delivered.len();
        let mut first = true;
        let mut refused = None;
        let mut bytes = 0;
        let read = super::packed::read_entries(payload, header.message_len, |range| {
            if refused.is_some() {
                return;
            }
            if let Err(error) = self
                .reassembly
                .check_whole(FrameKind::Packed, range.len() as u64)
            {
                refused = Some(error);
                return;
            }
            bytes += range.len() as u64;
            self.delivered.push_back(Message {
                body: Body::Shared {
                    slot: Arc::clone(&shared),
                    range: HEADER_LEN + range.start..HEADER_LEN + range.end,
                    first,
                },
            });
            first = false;
        });
        let outcome = match (read, refused) {
            (Err(error), _) => Err(peer(PeerViolation::Packed(error))),
            (Ok(()), Some(error)) => Err(peer(PeerViolation::Reassembly(error))),
            (Ok(()), None) => Ok(()),
        };
        if outcome.is_err() {
            self.delivered.truncate(queued);
        } else {
            self.stats.messages_received += header.message_len;
            self.stats.bytes_received += bytes;
        }
        outcome
    }
}

enum Body {
    /// The payload's `len` bytes after the header, in the receive slot it landed in.
    Slot {
        slot: LentSlot,
        len: usize,
    },
    /// The bytes at `range` of a packed frame's receive slot, which the frame's other
    /// messages share; `first` for the frame's first message, which alone counts the slot
    /// as lent while queued.
    Shared {
        slot: Arc<LentSlot>,
        range: std::ops::Range<usize>,
        first: bool,
    },
    Copied(LentBuffer),
    /// Read from the peer into a registered region of its own (`rendezvous.rs`).
    Landed(LentLanding),
}

/// A delivered message. One that arrived in one frame is a view onto the registered
/// receive slot it landed in (zero-copy); dropping it returns the slot to be reposted. A
/// segmented one was reassembled into its own buffer.
pub struct Message {
    body: Body,
}

impl Message {
    /// A message read from the peer into `landing`.
    pub(super) fn landed(landing: LentLanding) -> Message {
        Message {
            body: Body::Landed(landing),
        }
    }

    /// A copy of `message`'s bytes in a buffer of its own (the connection's spare, when it
    /// is large enough), which goes back to `returned` when the copy is dropped.
    fn copy_of(message: &Message, returned: &sync::Arc<ReturnedSlots>) -> Message {
        let mut copy = returned.take_buffer(message.len());
        copy.extend_from_slice(message);
        Message {
            body: Body::Copied(ReturnedSlots::lend_buffer(returned, copy)),
        }
    }

    /// Whether the bytes are still in the registered receive slot they arrived in (not
    /// copied). A message read from the peer (`docs/protocol.md`, "Rendezvous") is in a
    /// registered region of its own, not a receive slot: false.
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.body, Body::Slot { .. } | Body::Shared { .. })
    }

    /// Whether this message, queued for the user, holds a receive slot that no message
    /// before it in the queue holds: a zero-copy message of its own frame, or the first
    /// of a packed frame's.
    fn lends_its_slot(&self) -> bool {
        match &self.body {
            Body::Slot { .. } => true,
            Body::Shared { first, .. } => *first,
            Body::Copied(_) | Body::Landed(_) => false,
        }
    }

    /// Whether copying this message gives its receive slot back: it alone holds it.
    fn holds_slot_alone(&self) -> bool {
        match &self.body {
            Body::Slot { .. } => true,
            Body::Shared { slot, .. } => Arc::strong_count(slot) == 1,
            Body::Copied(_) | Body::Landed(_) => false,
        }
    }
}

impl Deref for Message {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.body {
            Body::Slot { slot, len } => &slot[HEADER_LEN..HEADER_LEN + len],
            Body::Shared { slot, range, .. } => &slot[range.clone()],
            Body::Copied(bytes) => bytes,
            Body::Landed(bytes) => bytes,
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("len", &self.len())
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}
