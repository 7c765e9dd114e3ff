//! The rendezvous (`docs/protocol.md`, "Rendezvous"): a message past the ladder's top tier
//! is not cut into frames. The sender copies it into a staging region, exposes that to the
//! peer for reading, and sends a small
//! [`FrameKind::Exposed`](super::FrameKind::Exposed) frame with the exposure's key,
//! address and length; the receiver reads the bytes with one one-sided read into a landing
//! region of its own, delivers the message from there, and answers with a
//! [`FrameKind::ReadDone`](super::FrameKind::ReadDone) frame, upon which the sender revokes
//! the exposure and keeps the region for the next such message. A receiver whose budget cannot
//! register the landing region answers
//! [`FrameKind::ReadRefused`](super::FrameKind::ReadRefused) instead, and the sender sends
//! the message in segments from its staging copy: nothing is lost for want of memory.
//! [`DataPath::OneSided`] chooses it; `transport/promotion/read` against `segmented`
//! (`benches/benches/transport.rs`) measures it.
//!
//! # Invariants
//!
//! - The sender exposes one message at a time: `outgoing` holds its staging region from
//!   the copy that fills it until the revocation that follows the peer's `ReadDone`
//!   returns. Nothing writes the region meanwhile. A revocation that failed, or never ran
//!   because the connection failed, leaves the region with the core until it is dropped,
//!   which the driver does only after closing the endpoint (the peer can read it no more).
//! - The receiver reads one message at a time: `incoming` holds the landing region from
//!   the `Exposed` frame until the read's completion, and no other request names it.
//!   Messages whose frames arrive meanwhile wait in `incoming.behind` and are delivered
//!   after it, so every message is delivered in sending order. A message read is
//!   delivered only once its `ReadDone` is handed to the transmitter (until then it waits
//!   in `incoming.read`): a user that takes it and never drives the connection again
//!   has still answered, so the sender's flush and its staging region are not held up by
//!   a connection nobody polls. A refused read keeps
//!   `incoming` (with no landing region) until the message's segments are reassembled,
//!   which are then delivered as that message, of its length, before those behind it.
//! - A sender never has a message exposed and one in segments at once: a message offered
//!   while either is under way waits ([`WouldBlock::ExposedUnread`],
//!   [`WouldBlock::SegmentedInFlight`]), so a refused read's segments find the outbox
//!   free.
//! - A descriptor is checked before anything is read: the message's length is within
//!   `max_message_len` and equals the exposed range's, no other message is being read, and
//!   no segmented message is half received. A peer that exposed nothing under its key, or
//!   fewer bytes, makes the read fail, which fails the connection as the peer's fault.
//! - Both regions are taken from the connection's reservoirs, a spare tier region that
//!   holds the message (registered and touched before, so the message pays for neither),
//!   or registered for it when no such spare is on the shelf, and charged to the budget
//!   either way. A landing region is lent to the message read into it and, given back,
//!   kept for the next (`returns.rs`); a staging region is kept for the next while no
//!   larger than the spare limit. Once no message too large for its tier has passed for
//!   the ladder's `demote_after`, both go back to their reservoirs, which deregister a
//!   region that was exposed (it was the peer's to name, and serves no other).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use tierbuf_pool::{PoolError, Region};
use tierbuf_tiers::controller::SendPlan;
use tierbuf_tiers::{Reservoir, TierIndex};

use super::config::DataPath;
use super::core::ConnectionCore;
use super::errors::{ConnectionError, PeerViolation, SendError, WorkKind, WouldBlock};
use super::header::{EXPOSED_LEN, FrameHeader, FrameKind, HEADER_LEN, READ_ANSWER_LEN};
use super::receive::Message;
use super::returns::ReturnedSlots;
use super::send::Payload;
use super::transmit::{Exposure, Queued, Transmit};
use crate::error::PostError;
use crate::exposure::Access;
use crate::provider::{BufferRef, RemoteBuffer};

/// The id of the one read a connection has in flight at most (module invariants); the
/// send slab's ids are indices, far below it.
pub(super) const READ_WR_ID: u64 = u64::MAX;

/// What a connection holds for messages read by one side from the other.
pub(super) struct Rendezvous {
    send_reservoir: Arc<Reservoir>,
    recv_reservoir: Arc<Reservoir>,
    /// The message this side exposed and the peer has not finished with.
    outgoing: Option<Outgoing>,
    /// The staging region of the last one, kept for the next.
    spare_staging: Option<Box<dyn Region>>,
    /// The message the peer exposed that this side is reading.
    incoming: Option<Incoming>,
    /// The answer to the last message the peer exposed (`ReadDone` or `ReadRefused`) and
    /// the exposure it names, to send once a credit allows.
    answer_owed: Option<(FrameKind, RemoteBuffer)>,
}

struct Outgoing {
    staging: Box<dyn Region>,
    len: usize,
    /// The exposure, once made (`transmit.rs`).
    exposed: Option<RemoteBuffer>,
    /// Whether the peer said it read the message: its revocation is queued.
    read: bool,
    /// When the peer must have read it by.
    deadline: Instant,
}

struct Incoming {
    remote: RemoteBuffer,
    /// The region it is read into; `None` once the read was refused, while its segments
    /// come.
    landing: Option<Box<dyn Region>>,
    /// The message, once read, until its answer is handed out (module invariants).
    read: Option<Message>,
    /// Messages whose frames came after the exposed one's, in order.
    behind: VecDeque<Message>,
}

impl Rendezvous {
    pub(super) fn new(
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
    ) -> Rendezvous {
        Rendezvous {
            send_reservoir,
            recv_reservoir,
            outgoing: None,
            spare_staging: None,
            incoming: None,
            answer_owed: None,
        }
    }

    /// Whether a message this side exposed is unanswered, one the peer exposed is being
    /// read, or an answer waits for a credit. (A message answered and not yet revoked
    /// has reached the peer: the revocation is this side's housekeeping.)
    pub(super) fn is_busy(&self) -> bool {
        self.is_unread() || self.incoming.is_some() || self.answer_owed.is_some()
    }

    /// Whether a message this side exposed has not been read yet.
    pub(super) fn is_unread(&self) -> bool {
        self.outgoing
            .as_ref()
            .is_some_and(|outgoing| !outgoing.read)
    }

    /// When the message this side exposed must have been read by.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.outgoing
            .as_ref()
            .filter(|outgoing| !outgoing.read)
            .map(|outgoing| outgoing.deadline)
    }

    /// Bytes registered for messages read by one side from the other, kept or in use.
    pub(super) fn registered_bytes(&self) -> usize {
        let outgoing = self.outgoing.as_ref().map_or(0, |out| out.staging.len());
        let spare = self.spare_staging.as_ref().map_or(0, |region| region.len());
        let incoming = self
            .incoming
            .as_ref()
            .and_then(|incoming| incoming.landing.as_ref())
            .map_or(0, |landing| landing.len());
        outgoing + spare + incoming
    }

    /// Gives the spare staging region back (the connection has been idle).
    pub(super) fn drop_spare(&mut self) {
        if let Some(region) = self.spare_staging.take() {
            give_back(&self.send_reservoir, region);
        }
    }

    /// The reservoir the landing regions come from, to give one back to.
    pub(super) fn recv_reservoir(&self) -> &Arc<Reservoir> {
        &self.recv_reservoir
    }
}

/// A region of at least `len` bytes: a spare of the smallest tier of `reservoir` whose
/// region holds it, if one is on the shelf; else one registered for it, in whole pages,
/// so that a kept spare serves the next message of about the same length.
fn region_for(reservoir: &Reservoir, len: usize) -> Result<Box<dyn Region>, PoolError> {
    let fitting = reservoir
        .ladder()
        .tiers()
        .iter()
        .position(|spec| spec.region_len() >= len)
        .map(|index| TierIndex::new(index as u8))
        .filter(|&tier| reservoir.spare(tier) > 0);
    if let Some(tier) = fitting
        && let Ok((region, _)) = reservoir.take(tier)
    {
        return Ok(region);
    }
    let page = tierbuf_pool::page_size();
    reservoir
        .registrar()
        .register(len.max(1).next_multiple_of(page), page)
}

/// Gives `region` back to `reservoir`: onto the shelf of the tier whose regions are as
/// long, which keeps it unless it was exposed or the shelf is full; any other is
/// deregistered.
pub(super) fn give_back(reservoir: &Reservoir, region: Box<dyn Region>) {
    let tier = reservoir
        .ladder()
        .tiers()
        .iter()
        .position(|spec| spec.region_len() == region.len());
    match tier {
        Some(index) => reservoir.give_back(TierIndex::new(index as u8), region),
        None => drop(region),
    }
}

fn encode_exposed(remote: RemoteBuffer) -> [u8; EXPOSED_LEN] {
    let mut bytes = [0u8; EXPOSED_LEN];
    bytes[0..4].copy_from_slice(&remote.key.to_le_bytes());
    bytes[4..8].copy_from_slice(&remote.len.to_le_bytes());
    bytes[8..16].copy_from_slice(&remote.addr.to_le_bytes());
    bytes
}

fn decode_exposed(payload: &[u8]) -> Option<RemoteBuffer> {
    let bytes: &[u8; EXPOSED_LEN] = payload.try_into().ok()?;
    let [k0, k1, k2, k3, l0, l1, l2, l3, addr @ ..] = *bytes;
    Some(RemoteBuffer {
        key: u32::from_le_bytes([k0, k1, k2, k3]),
        len: u32::from_le_bytes([l0, l1, l2, l3]),
        addr: u64::from_le_bytes(addr),
    })
}

fn encode_answer(remote: RemoteBuffer) -> [u8; READ_ANSWER_LEN] {
    let mut bytes = [0u8; READ_ANSWER_LEN];
    bytes[0..4].copy_from_slice(&remote.key.to_le_bytes());
    bytes[4..8].copy_from_slice(&remote.len.to_le_bytes());
    bytes
}

fn decode_answer(payload: &[u8]) -> Option<(u32, u32)> {
    let bytes: &[u8; READ_ANSWER_LEN] = payload.try_into().ok()?;
    let [k0, k1, k2, k3, l0, l1, l2, l3] = *bytes;
    Some((
        u32::from_le_bytes([k0, k1, k2, k3]),
        u32::from_le_bytes([l0, l1, l2, l3]),
    ))
}

impl ConnectionCore {
    /// Takes the planned prefix of `parts` on as a message for the peer to read, if this
    /// connection's data path is one-sided: copies it into the staging region and queues
    /// the frame that tells the peer of it (the exposure is made when that frame is handed
    /// out, `transmit.rs`). `None` leaves the message to segments: the data path is
    /// two-sided; the message is past what one exposure names (4 GiB); no staging region
    /// could be had (the budget is spent); or the ladder's top tier carries it whole. Such
    /// a message goes in segments only until its promotion lands, and a staging region
    /// new to the connection costs more than its frames: its registration, the first
    /// touch of its pages, and its first exposure to the peer (an exposed region serves one
    /// connection, so every connection pays for its first; `docs/transport.md`, "An 8 KiB
    /// message in segments", has the measurement). A message past the top tier would go
    /// in segments every time, so it is exposed, and its region is kept for the next
    /// (`transport/promotion/read` against `segmented`, `docs/benchmarks.md`).
    pub(super) fn start_exposed(
        &mut self,
        now: Instant,
        parts: &[IoSlice<'_>],
        plan: &SendPlan,
    ) -> Option<Result<usize, SendError>> {
        let len = plan.bytes;
        if self.config.data_path() != DataPath::OneSided {
            return None;
        }
        // Before anything may fall back to segments (module invariants).
        if self.rendezvous.outgoing.is_some() {
            self.relieve_receives();
            return Some(Err(SendError::WouldBlock(WouldBlock::ExposedUnread)));
        }
        let top = TierIndex::new((self.config.ladder().len() - 1) as u8);
        if u32::try_from(len).is_err() || len <= self.tiers.whole(top) {
            return None;
        }
        if self.frame_credit(EXPOSED_LEN, true).is_none() {
            self.relieve_receives();
            return Some(Err(SendError::WouldBlock(WouldBlock::NoCredit)));
        }
        let Some(mut slot) = self.acquire_send_slot(HEADER_LEN + EXPOSED_LEN) else {
            return Some(Err(SendError::WouldBlock(WouldBlock::NoCredit)));
        };
        let rendezvous = &mut self.rendezvous;
        let staging = match rendezvous.spare_staging.take() {
            Some(spare) if spare.len() >= len => spare,
            // A smaller spare goes back before its successor is charged to the budget.
            smaller => {
                if let Some(smaller) = smaller {
                    give_back(&rendezvous.send_reservoir, smaller);
                }
                match region_for(&rendezvous.send_reservoir, len) {
                    Ok(region) => region,
                    Err(error) => {
                        tracing::debug!(%error, len, "no staging region: the message goes in segments");
                        self.keep_send_slot(slot);
                        return None;
                    }
                }
            }
        };
        // SAFETY: the staging region is this core's alone: not exposed (a spare's last
        // exposure was revoked before it was kept) and named by no request (module
        // invariants); it holds at least `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(staging.base().as_ptr(), len) };
        let mut at = 0;
        for part in &parts[..plan.elements] {
            bytes[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        self.credits.take();
        let mut header = FrameHeader::exposed(len);
        header.grant = self.grants.take();
        header.encode(&mut slot[..HEADER_LEN]);
        let wr_id = self.sending.insert(None) as u64;
        let keys = staging.keys();
        let staged = BufferRef {
            remote_key: keys.remote_key,
            addr: keys.remote_addr,
            len: len as u32,
        };
        self.work.push_back(Queued::Expose {
            wr_id,
            slot,
            staged,
        });
        self.rendezvous.outgoing = Some(Outgoing {
            staging,
            len,
            exposed: None,
            read: false,
            deadline: now + self.config.read_timeout(),
        });
        self.oversize_at = Some(now);
        self.stats.frames_sent += 1;
        self.stats.messages_sent += 1;
        self.stats.messages_exposed += 1;
        self.stats.bytes_sent += len as u64;
        Some(Ok(len))
    }

    /// Exposes `staged`, the staged message, for the frame at the front of the work queue
    /// that tells the peer of it, writes the descriptor into that frame, and leaves the
    /// frame at the front as a send (`transmit.rs`, module invariants).
    pub(super) fn expose_staged(
        &mut self,
        to: &mut impl Transmit,
        staged: BufferRef,
    ) -> Result<(), PostError> {
        let remote = to.expose(Exposure::new(staged, Access::Read))?;
        if let Some(outgoing) = &mut self.rendezvous.outgoing {
            outgoing.exposed = Some(remote);
        }
        if let Some(Queued::Expose {
            wr_id, mut slot, ..
        }) = self.work.pop_front()
        {
            slot[HEADER_LEN..HEADER_LEN + EXPOSED_LEN].copy_from_slice(&encode_exposed(remote));
            let buffer = BufferRef {
                remote_key: slot.keys().remote_key,
                addr: slot.remote_addr(),
                len: (HEADER_LEN + EXPOSED_LEN) as u32,
            };
            self.sending[wr_id as usize] = Some(slot);
            self.work.push_front(Queued::Send { wr_id, buffer });
        }
        Ok(())
    }

    /// The peer's answer (`kind`, `ReadDone` or `ReadRefused`) to this side's message
    /// exposed and unread, naming its exposure: queues the revocation, and for a refusal
    /// sends the message in segments from the staging copy.
    pub(super) fn peer_answered(
        &mut self,
        kind: FrameKind,
        payload: &[u8],
    ) -> Result<(), ConnectionError> {
        let (key, len) = decode_answer(payload).unwrap_or_default();
        let answered = self.rendezvous.outgoing.as_mut().and_then(|outgoing| {
            let exposed = outgoing
                .exposed
                .filter(|exposed| !outgoing.read && exposed.key == key && exposed.len == len)?;
            outgoing.read = true;
            Some((exposed, outgoing.staging.base()))
        });
        let Some((exposed, staged)) = answered else {
            return Err(ConnectionError::PeerProtocol(
                PeerViolation::UnexposedReadDone { key, len },
            ));
        };
        if self.failed.is_some() {
            // An answer that came before the peer's close: the message reached it. The
            // endpoint is closed, so the region stays with the core until it is dropped.
            return Ok(());
        }
        if kind == FrameKind::ReadRefused {
            // SAFETY: the staging region holds the message's `len` bytes, which only the
            // peer reads while the exposure is in force; nothing writes them.
            let staged = unsafe { std::slice::from_raw_parts(staged.as_ptr(), len as usize) };
            let mut copy = std::mem::take(&mut self.spare_outbox);
            copy.clear();
            copy.extend_from_slice(staged);
            self.segment_copy(copy);
        }
        self.work.push_back(Queued::Revoke { remote: exposed });
        Ok(())
    }

    /// The exposure `remote` ended: the staging region is this side's again, kept for the
    /// next message if no larger than the spare limit. Returns true, for the transmitter.
    pub(super) fn revoked(&mut self, remote: RemoteBuffer) -> bool {
        if let Some(outgoing) = self
            .rendezvous
            .outgoing
            .take_if(|outgoing| outgoing.exposed == Some(remote))
            && outgoing.staging.len() <= self.config.spare_buffer_limit()
        {
            self.rendezvous.spare_staging = Some(outgoing.staging);
        }
        true
    }

    /// Fails the connection if the message this side exposed has not been read by its
    /// deadline.
    pub(super) fn check_read_deadline(&mut self, now: Instant) {
        if let Some(outgoing) = &self.rendezvous.outgoing
            && !outgoing.read
            && now >= outgoing.deadline
        {
            let len = outgoing.len;
            self.fail(ConnectionError::PeerProtocol(PeerViolation::ReadNotDone {
                len,
                timeout: self.config.read_timeout(),
            }));
        }
    }

    /// The peer's `Exposed` frame: checks its descriptor and queues the read of the
    /// message into a landing region (module invariants).
    pub(super) fn start_read(
        &mut self,
        header: FrameHeader,
        payload: &[u8],
    ) -> Result<(), ConnectionError> {
        let peer = ConnectionError::PeerProtocol;
        self.reassembly
            .check_whole(FrameKind::Exposed, header.message_len)
            .map_err(|error| peer(PeerViolation::Reassembly(error)))?;
        if self.rendezvous.incoming.is_some() {
            return Err(peer(PeerViolation::SecondExposure));
        }
        let remote = decode_exposed(payload)
            .filter(|remote| u64::from(remote.len) == header.message_len)
            .ok_or(peer(PeerViolation::ExposedRange {
                range: decode_exposed(payload).map_or(0, |remote| u64::from(remote.len)),
                len: header.message_len,
            }))?;
        let len = remote.len as usize;
        let landing = match self.returned.take_spare_landing() {
            Some(spare) if spare.len() >= len => Some(spare),
            smaller => {
                if let Some(smaller) = smaller {
                    give_back(&self.rendezvous.recv_reservoir, smaller);
                }
                match region_for(&self.rendezvous.recv_reservoir, len) {
                    Ok(region) => Some(region),
                    Err(error) => {
                        tracing::debug!(%error, len, "no landing region: the message is asked for in segments");
                        None
                    }
                }
            }
        };
        match &landing {
            Some(region) => {
                let keys = region.keys();
                let buffer = BufferRef {
                    remote_key: keys.remote_key,
                    addr: keys.remote_addr,
                    len: remote.len,
                };
                self.work.push_back(Queued::Read { buffer, remote });
            }
            None => {
                self.stats.reads_refused += 1;
                self.rendezvous.answer_owed = Some((FrameKind::ReadRefused, remote));
                self.send_answer();
            }
        }
        self.rendezvous.incoming = Some(Incoming {
            remote,
            landing,
            read: None,
            behind: VecDeque::new(),
        });
        Ok(())
    }

    /// Queues a reassembled `message` for the user: the message whose read was refused,
    /// if one is awaited (then those that came behind it), else as any other.
    pub(super) fn deliver_reassembled(&mut self, message: Message) -> Result<(), ConnectionError> {
        let Some(incoming) = self
            .rendezvous
            .incoming
            .take_if(|incoming| incoming.landing.is_none() && incoming.read.is_none())
        else {
            self.deliver(message);
            return Ok(());
        };
        if message.len() != incoming.remote.len as usize {
            return Err(ConnectionError::PeerProtocol(PeerViolation::ExposedRange {
                range: message.len() as u64,
                len: u64::from(incoming.remote.len),
            }));
        }
        self.delivered.push_back(message);
        self.delivered.extend(incoming.behind);
        Ok(())
    }

    /// Queues `message` for the user, behind the message being read if there is one.
    #[inline(always)]
    pub(super) fn deliver(&mut self, message: Message) {
        match &mut self.rendezvous.incoming {
            None => self.delivered.push_back(message),
            Some(incoming) => incoming.behind.push_back(message),
        }
    }

    /// Moves the messages delivered from index `from` on behind the message being read,
    /// if there is one (a packed frame's, delivered together).
    pub(super) fn hold_behind_read(&mut self, from: usize) {
        if let Some(incoming) = &mut self.rendezvous.incoming {
            incoming.behind.extend(self.delivered.drain(from..));
        }
    }

    /// The completion of the read of the message the peer exposed, `len` bytes read:
    /// answers the peer, and delivers the message, then those that came behind it, once
    /// the answer is handed out (module invariants).
    pub(super) fn finish_read(&mut self, len: u32) -> Result<(), ConnectionError> {
        let unknown = ConnectionError::UnknownWorkRequest {
            kind: WorkKind::Read,
            wr_id: READ_WR_ID,
        };
        let Some(incoming) = self
            .rendezvous
            .incoming
            .as_mut()
            .filter(|incoming| incoming.read.is_none())
        else {
            return Err(unknown);
        };
        let Some(landing) = incoming.landing.take() else {
            return Err(unknown);
        };
        let remote = incoming.remote;
        if len != remote.len {
            return Err(ConnectionError::Post(PostError::LengthMismatch {
                local: u64::from(len),
                remote: remote.len,
            }));
        }
        let len = len as usize;
        incoming.read = Some(Message::landed(ReturnedSlots::lend_landing(
            &self.returned,
            landing,
            len,
        )));
        self.stats.messages_received += 1;
        self.stats.messages_read += 1;
        self.stats.bytes_received += len as u64;
        self.rendezvous.answer_owed = Some((FrameKind::ReadDone, remote));
        self.send_answer();
        Ok(())
    }

    /// A read that will not complete (it failed, or the connection did): its landing
    /// region is free again.
    pub(super) fn take_back_read(&mut self) {
        self.rendezvous.incoming = None;
    }

    /// Posts the answer owed to the peer's exposed message, if a credit and a send slot
    /// allow; a message read is delivered then (module invariants).
    pub(super) fn send_answer(&mut self) {
        let Some((kind, remote)) = self.rendezvous.answer_owed else {
            return;
        };
        let answer = encode_answer(remote);
        if !self.post_frame(
            FrameHeader::read_answer(kind),
            Payload::Bytes(&answer),
            false,
        ) {
            return;
        }
        self.rendezvous.answer_owed = None;
        if let Some(incoming) = self
            .rendezvous
            .incoming
            .take_if(|incoming| incoming.read.is_some())
        {
            self.delivered.extend(incoming.read);
            self.delivered.extend(incoming.behind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_refuse_other_lengths() {
        let remote = RemoteBuffer {
            key: 0xdead_beef,
            addr: 0x7f00_1234_5000,
            len: 1 << 20,
        };
        assert_eq!(decode_exposed(&encode_exposed(remote)), Some(remote));
        assert_eq!(decode_exposed(&encode_exposed(remote)[..15]), None);
        assert_eq!(
            decode_answer(&encode_answer(remote)),
            Some((remote.key, remote.len))
        );
        assert_eq!(decode_answer(&[0; 9]), None);
    }
}
