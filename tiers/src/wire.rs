//! The binary encoding of the negotiation's control messages.
//!
//! Every frame has the same envelope, little-endian throughout:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | head flag, `0xB17E` |
//! | 2 | 1 | protocol version, 1 |
//! | 3 | 1 | message type |
//! | 4 | 2 | body length `n` |
//! | 6 | `n` | body (fixed layout per message type) |
//! | 6 + `n` | 2 | tail flag, `0xE7A1` |
//!
//! # Invariants
//!
//! - A frame is taken for a whole message only if its head flag *and* its tail flag are
//!   present and right (their origin is in `docs/protocol.md`). A receive slot is zeroed before it
//!   is reused and written front to back, so a frame whose head is written but whose tail is
//!   not yet (wholly) written is a torn write in progress: [`try_decode`] reports it as [`FrameStatus::Incomplete`], distinct from
//!   a malformed frame, and never hands out its fields.
//! - [`decode`] and [`try_decode`] never panic, whatever the input, and every message they
//!   return would be accepted by [`encode`]: epochs of requests and answers are non-zero, slot
//!   sizes and counts are non-zero, nack reasons are known. Which tiers exist is a matter of
//!   the ladder, checked by the negotiation, not by the codec.
//! - [`encode`] refuses what [`decode`] would refuse, so a frame we send is one the peer
//!   accepts, and every frame is at most [`MAX_FRAME_LEN`] bytes: small enough for the
//!   smallest tier.

use crate::negotiation::TierShape;
use crate::{RegionDescriptor, TierIndex};

/// The two bytes every frame starts with. Zero means "not written yet".
pub(crate) const HEAD_FLAG: u16 = 0xB17E;
/// The two bytes every frame ends with. Zero means "not written yet".
pub(crate) const TAIL_FLAG: u16 = 0xE7A1;
/// The version of the protocol this codec speaks.
pub(crate) const PROTOCOL_VERSION: u8 = 1;
/// The bytes before the body: head flag, version, type, body length.
pub const HEADER_LEN: usize = 6;
/// The bytes after the body: the tail flag.
pub(crate) const TRAILER_LEN: usize = 2;
/// The longest frame any message encodes to (an ack); a buffer of this size holds any frame.
///
/// ```
/// assert!(tierbuf_tiers::wire::MAX_FRAME_LEN <= 64);
/// ```
pub const MAX_FRAME_LEN: usize = HEADER_LEN + MessageKind::Ack.body_len() as usize + TRAILER_LEN;

const _: () = assert!(
    MAX_FRAME_LEN <= 64,
    "control frames must fit the smallest tier"
);

/// A negotiation round's sequence number. Each direction of a connection counts its own.
///
/// Epoch 0 names the smallest tier a connection starts on, provisioned at connect time; every
/// request takes the next epoch, so a message's epoch tells whether it is current, stale or a
/// duplicate.
///
/// ```
/// use tierbuf_tiers::wire::Epoch;
/// assert!(Epoch::INITIAL < Epoch::INITIAL.next());
/// assert_eq!(Epoch::new(7).get(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

impl Epoch {
    /// The epoch of the tier a connection starts on.
    pub const INITIAL: Epoch = Epoch(0);

    /// The epoch numbered `value`.
    pub const fn new(value: u64) -> Epoch {
        Epoch(value)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch after this one.
    pub const fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// Why a peer refused to provision a tier.
///
/// ```
/// use tierbuf_tiers::wire::NackReason;
/// assert_eq!(NackReason::from_code(NackReason::OverBudget.code()), Some(NackReason::OverBudget));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NackReason {
    /// The peer's memory budget cannot hold the tier.
    OverBudget,
    /// The tier is not on the peer's ladder.
    BeyondLadder,
    /// The peer cannot change tiers now; asking again later may succeed.
    Busy,
}

impl NackReason {
    /// The byte that stands for this reason on the wire.
    pub const fn code(self) -> u8 {
        match self {
            NackReason::OverBudget => 1,
            NackReason::BeyondLadder => 2,
            NackReason::Busy => 3,
        }
    }

    /// The reason a wire byte stands for, if any.
    pub const fn from_code(code: u8) -> Option<NackReason> {
        match code {
            1 => Some(NackReason::OverBudget),
            2 => Some(NackReason::BeyondLadder),
            3 => Some(NackReason::Busy),
            _ => None,
        }
    }
}

impl std::fmt::Display for NackReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NackReason::OverBudget => "over budget",
            NackReason::BeyondLadder => "beyond the ladder",
            NackReason::Busy => "busy",
        })
    }
}

/// A control message of the negotiation.
///
/// Requests, releases and abandons travel from the side that sends data to the side that
/// receives it; acks and nacks travel back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlMessage {
    /// "Provision your receive buffers at `tier`": a promotion or a demotion, depending on the
    /// tier in force. `current` is the epoch whose region the sender is using as it asks.
    Request {
        /// This request's epoch; retries repeat it.
        epoch: Epoch,
        /// The tier asked for.
        tier: TierIndex,
        /// The epoch of the grant the sender uses while it asks.
        current: Epoch,
    },
    /// "The buffers of `tier` are provisioned": what the sender needs to switch.
    Ack {
        /// The epoch of the request this answers.
        epoch: Epoch,
        /// The tier provisioned.
        tier: TierIndex,
        /// The slot size and count of the provisioned buffers.
        shape: TierShape,
        /// Where the provisioned buffers are.
        region: RegionDescriptor,
    },
    /// "I will not provision `tier`".
    Nack {
        /// The epoch of the request this answers.
        epoch: Epoch,
        /// The tier refused.
        tier: TierIndex,
        /// Why.
        reason: NackReason,
    },
    /// "I switched to the grant of `epoch` and stopped using the region it replaces."
    Released {
        /// The epoch of the grant now in use.
        epoch: Epoch,
    },
    /// "I gave up on the request of `epoch` and will never use what it provisions."
    Abandon {
        /// The epoch of the request given up.
        epoch: Epoch,
    },
}

/// The type of a control message, as the frame's type byte names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// [`ControlMessage::Request`].
    Request,
    /// [`ControlMessage::Ack`].
    Ack,
    /// [`ControlMessage::Nack`].
    Nack,
    /// [`ControlMessage::Released`].
    Released,
    /// [`ControlMessage::Abandon`].
    Abandon,
}

impl MessageKind {
    /// The type byte on the wire.
    pub const fn code(self) -> u8 {
        match self {
            MessageKind::Request => 1,
            MessageKind::Ack => 2,
            MessageKind::Nack => 3,
            MessageKind::Released => 4,
            MessageKind::Abandon => 5,
        }
    }

    /// The kind a type byte names, if any.
    pub const fn from_code(code: u8) -> Option<MessageKind> {
        match code {
            1 => Some(MessageKind::Request),
            2 => Some(MessageKind::Ack),
            3 => Some(MessageKind::Nack),
            4 => Some(MessageKind::Released),
            5 => Some(MessageKind::Abandon),
            _ => None,
        }
    }

    /// The fixed length of this kind's body in bytes.
    pub const fn body_len(self) -> u16 {
        const EPOCH: u16 = 8;
        const TIER: u16 = 1;
        match self {
            MessageKind::Request => EPOCH + TIER + EPOCH,
            // slot size, slot count, region address, region length, remote key
            MessageKind::Ack => EPOCH + TIER + 4 + 4 + 8 + 8 + 4,
            MessageKind::Nack => EPOCH + TIER + 1,
            MessageKind::Released | MessageKind::Abandon => EPOCH,
        }
    }

    /// The length of a whole frame of this kind.
    pub const fn frame_len(self) -> usize {
        HEADER_LEN + self.body_len() as usize + TRAILER_LEN
    }
}

impl ControlMessage {
    /// The kind of this message.
    pub const fn kind(&self) -> MessageKind {
        match self {
            ControlMessage::Request { .. } => MessageKind::Request,
            ControlMessage::Ack { .. } => MessageKind::Ack,
            ControlMessage::Nack { .. } => MessageKind::Nack,
            ControlMessage::Released { .. } => MessageKind::Released,
            ControlMessage::Abandon { .. } => MessageKind::Abandon,
        }
    }

    /// The epoch this message belongs to.
    pub const fn epoch(&self) -> Epoch {
        match *self {
            ControlMessage::Request { epoch, .. }
            | ControlMessage::Ack { epoch, .. }
            | ControlMessage::Nack { epoch, .. }
            | ControlMessage::Released { epoch }
            | ControlMessage::Abandon { epoch } => epoch,
        }
    }

    /// Checks what the codec promises about every message it handles.
    fn validate(&self) -> Result<(), WireError> {
        if self.epoch() == Epoch::INITIAL {
            return Err(WireError::ZeroEpoch { kind: self.kind() });
        }
        if let ControlMessage::Ack { shape, .. } = self {
            if shape.slot_size == 0 {
                return Err(WireError::ZeroSlotSize);
            }
            if shape.slot_count == 0 {
                return Err(WireError::ZeroSlotCount);
            }
        }
        Ok(())
    }
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The output buffer is too small for the frame.
    #[error("a {needed}-byte frame does not fit a {available}-byte buffer")]
    BufferTooSmall {
        /// The frame's length.
        needed: usize,
        /// The buffer's length.
        available: usize,
    },
    /// The input ends before the frame does.
    #[error("frame truncated: {available} bytes present, at least {needed} needed")]
    Truncated {
        /// How many bytes the frame needs (as far as the bytes present tell).
        needed: usize,
        /// How many bytes there are.
        available: usize,
    },
    /// The head flag is written but the tail flag is not yet (wholly): a write in progress.
    #[error("torn frame: head flag present, tail flag not yet written")]
    TornFrame {
        /// The length the frame will have when whole.
        frame_len: usize,
    },
    /// The frame does not start with the head flag, `0xB17E` (zero, or its first byte
    /// only: a write that has not reached it yet).
    #[error("bad head flag {found:#06x} (expected {HEAD_FLAG:#06x})")]
    BadHeadFlag {
        /// The bytes found.
        found: u16,
    },
    /// The frame does not end with the tail flag, `0xE7A1`, and the tail is not merely
    /// unwritten.
    #[error("bad tail flag {found:#06x} (expected {TAIL_FLAG:#06x})")]
    BadTailFlag {
        /// The bytes found.
        found: u16,
    },
    /// The frame speaks another protocol version.
    #[error("unsupported protocol version {found} (this side speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u8,
    },
    /// The type byte names no message.
    #[error("unknown message type {found}")]
    UnknownMessageType {
        /// The type byte found.
        found: u8,
    },
    /// The declared body length is longer than any message's body.
    #[error("declared body length {found} exceeds the longest body ({max})")]
    BodyTooLong {
        /// The declared length.
        found: u16,
        /// The longest body of any message.
        max: u16,
    },
    /// The declared body length does not match the message type's fixed layout.
    #[error("{kind:?} body must be {expected} bytes, frame declares {found}")]
    BodyLengthMismatch {
        /// The message type.
        kind: MessageKind,
        /// Its body length.
        expected: u16,
        /// The declared length.
        found: u16,
    },
    /// Bytes follow the frame in a buffer that should hold exactly one frame.
    #[error("{extra} bytes after a {frame_len}-byte frame")]
    TrailingBytes {
        /// The frame's length.
        frame_len: usize,
        /// How many bytes follow it.
        extra: usize,
    },
    /// A message carries epoch 0, which no request ever has.
    #[error("{kind:?} with epoch 0")]
    ZeroEpoch {
        /// The message type.
        kind: MessageKind,
    },
    /// An ack announces slots of zero bytes.
    #[error("ack with slot size 0")]
    ZeroSlotSize,
    /// An ack announces zero slots.
    #[error("ack with slot count 0")]
    ZeroSlotCount,
    /// A nack's reason byte names no reason.
    #[error("unknown nack reason {found}")]
    UnknownNackReason {
        /// The reason byte found.
        found: u8,
    },
}

impl WireError {
    /// Whether the bytes may still become a valid frame: nothing written yet, a prefix of a
    /// frame, or a torn frame whose tail flag is not written yet. Everything else is malformed.
    ///
    /// ```
    /// use tierbuf_tiers::wire::{decode, WireError};
    /// assert!(decode(&[0; 8]).unwrap_err().is_incomplete());
    /// assert!(!decode(&[0xFF; 8]).unwrap_err().is_incomplete());
    /// ```
    pub fn is_incomplete(&self) -> bool {
        match *self {
            WireError::BadHeadFlag { found } => is_partly_written(found, HEAD_FLAG),
            WireError::Truncated { .. } | WireError::TornFrame { .. } => true,
            _ => false,
        }
    }
}

/// What [`try_decode`] found in a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameStatus {
    /// A whole, valid frame.
    Complete {
        /// The message it carries.
        message: ControlMessage,
        /// How many bytes of the buffer the frame took.
        frame_len: usize,
    },
    /// No whole frame yet: poll again later.
    Incomplete,
}

/// Encodes `message` into the front of `out` and returns the frame's length.
///
/// ```
/// use tierbuf_tiers::wire::{decode, encode, ControlMessage, Epoch, MAX_FRAME_LEN};
/// use tierbuf_tiers::TierIndex;
/// let message = ControlMessage::Request {
///     epoch: Epoch::new(1),
///     tier: TierIndex::new(2),
///     current: Epoch::INITIAL,
/// };
/// let mut frame = [0u8; MAX_FRAME_LEN];
/// let len = encode(&message, &mut frame)?;
/// assert_eq!(decode(&frame[..len])?, message);
/// # Ok::<(), tierbuf_tiers::wire::WireError>(())
/// ```
pub fn encode(message: &ControlMessage, out: &mut [u8]) -> Result<usize, WireError> {
    message.validate()?;
    let kind = message.kind();
    let frame_len = kind.frame_len();
    let Some(frame) = out.get_mut(..frame_len) else {
        return Err(WireError::BufferTooSmall {
            needed: frame_len,
            available: out.len(),
        });
    };
    let mut writer = Writer { frame, pos: 0 };
    writer.put(&HEAD_FLAG.to_le_bytes());
    writer.put(&[PROTOCOL_VERSION, kind.code()]);
    writer.put(&kind.body_len().to_le_bytes());
    match *message {
        ControlMessage::Request {
            epoch,
            tier,
            current,
        } => {
            writer.put(&epoch.get().to_le_bytes());
            writer.put(&[tier.get()]);
            writer.put(&current.get().to_le_bytes());
        }
        ControlMessage::Ack {
            epoch,
            tier,
            shape,
            region,
        } => {
            writer.put(&epoch.get().to_le_bytes());
            writer.put(&[tier.get()]);
            writer.put(&shape.slot_size.to_le_bytes());
            writer.put(&shape.slot_count.to_le_bytes());
            writer.put(&region.addr.to_le_bytes());
            writer.put(&region.len.to_le_bytes());
            writer.put(&region.remote_key.to_le_bytes());
        }
        ControlMessage::Nack {
            epoch,
            tier,
            reason,
        } => {
            writer.put(&epoch.get().to_le_bytes());
            writer.put(&[tier.get(), reason.code()]);
        }
        ControlMessage::Released { epoch } | ControlMessage::Abandon { epoch } => {
            writer.put(&epoch.get().to_le_bytes());
        }
    }
    writer.put(&TAIL_FLAG.to_le_bytes());
    debug_assert_eq!(writer.pos, frame_len);
    Ok(frame_len)
}

/// Decodes exactly one whole frame; every malformed, torn, short or over-long input is an error.
///
/// ```
/// use tierbuf_tiers::wire::{decode, encode, ControlMessage, Epoch, WireError};
/// let mut frame = [0u8; 24];
/// let len = encode(&ControlMessage::Released { epoch: Epoch::new(3) }, &mut frame)?;
/// assert_eq!(decode(&frame[..len])?, ControlMessage::Released { epoch: Epoch::new(3) });
/// assert!(matches!(decode(&frame), Err(WireError::TrailingBytes { .. })));
/// # Ok::<(), WireError>(())
/// ```
pub fn decode(bytes: &[u8]) -> Result<ControlMessage, WireError> {
    let (message, frame_len) = parse(bytes)?;
    if bytes.len() > frame_len {
        return Err(WireError::TrailingBytes {
            frame_len,
            extra: bytes.len() - frame_len,
        });
    }
    Ok(message)
}

/// Looks for a frame at the front of a receive buffer that may still be being written.
///
/// Bytes after the frame are ignored (a receive slot is larger than a frame). A buffer whose
/// head flag is unwritten, that ends early, or whose tail flag is unwritten is
/// [`FrameStatus::Incomplete`]; anything else that is not a valid frame is an error.
///
/// ```
/// use tierbuf_tiers::wire::{encode, try_decode, ControlMessage, Epoch, FrameStatus};
/// let message = ControlMessage::Abandon { epoch: Epoch::new(9) };
/// let mut slot = [0u8; 64];
/// let mut frame = [0u8; 64];
/// let len = encode(&message, &mut frame)?;
/// // The peer's write has reached everything but the tail flag:
/// slot[..len - 2].copy_from_slice(&frame[..len - 2]);
/// assert_eq!(try_decode(&slot)?, FrameStatus::Incomplete);
/// slot[len - 2..len].copy_from_slice(&frame[len - 2..len]);
/// assert_eq!(try_decode(&slot)?, FrameStatus::Complete { message, frame_len: len });
/// # Ok::<(), tierbuf_tiers::wire::WireError>(())
/// ```
pub fn try_decode(buffer: &[u8]) -> Result<FrameStatus, WireError> {
    match parse(buffer) {
        Ok((message, frame_len)) => Ok(FrameStatus::Complete { message, frame_len }),
        Err(error) if error.is_incomplete() => Ok(FrameStatus::Incomplete),
        Err(error) => Err(error),
    }
}

/// The longest body of any message kind.
const MAX_BODY_LEN: u16 = MessageKind::Ack.body_len();

/// Whether `found` is what a flag's two bytes read while a front-to-back write has reached
/// none or only the first of them (the slot was zeroed before).
fn is_partly_written(found: u16, flag: u16) -> bool {
    found == 0 || found == flag & 0x00FF
}

/// Parses the frame at the front of `bytes` and returns it with its length.
///
/// The tail flag is checked before the version, the type and the body, so that the fields of
/// a torn frame are never looked at.
fn parse(bytes: &[u8]) -> Result<(ControlMessage, usize), WireError> {
    let mut header = Reader::new(bytes);
    let head = u16::from_le_bytes(header.take()?);
    if head != HEAD_FLAG {
        return Err(WireError::BadHeadFlag { found: head });
    }
    let [version, type_code] = header.take()?;
    let body_len = u16::from_le_bytes(header.take()?);
    if body_len > MAX_BODY_LEN {
        return Err(WireError::BodyTooLong {
            found: body_len,
            max: MAX_BODY_LEN,
        });
    }
    let frame_len = HEADER_LEN + usize::from(body_len) + TRAILER_LEN;
    let tail_at = frame_len - TRAILER_LEN;
    let tail = match bytes.get(tail_at..frame_len) {
        Some(&[low, high]) => u16::from_le_bytes([low, high]),
        _ => {
            return Err(WireError::Truncated {
                needed: frame_len,
                available: bytes.len(),
            });
        }
    };
    if tail != TAIL_FLAG {
        return Err(if is_partly_written(tail, TAIL_FLAG) {
            WireError::TornFrame { frame_len }
        } else {
            WireError::BadTailFlag { found: tail }
        });
    }
    if version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion { found: version });
    }
    let kind = MessageKind::from_code(type_code)
        .ok_or(WireError::UnknownMessageType { found: type_code })?;
    if body_len != kind.body_len() {
        return Err(WireError::BodyLengthMismatch {
            kind,
            expected: kind.body_len(),
            found: body_len,
        });
    }
    let mut body = Reader::new(bytes.get(HEADER_LEN..tail_at).unwrap_or_default());
    let epoch = Epoch::new(body.u64()?);
    let message = match kind {
        MessageKind::Request => ControlMessage::Request {
            epoch,
            tier: TierIndex::new(body.u8()?),
            current: Epoch::new(body.u64()?),
        },
        MessageKind::Ack => ControlMessage::Ack {
            epoch,
            tier: TierIndex::new(body.u8()?),
            shape: TierShape {
                slot_size: body.u32()?,
                slot_count: body.u32()?,
            },
            region: RegionDescriptor {
                addr: body.u64()?,
                len: body.u64()?,
                remote_key: body.u32()?,
            },
        },
        MessageKind::Nack => {
            let tier = TierIndex::new(body.u8()?);
            let code = body.u8()?;
            let reason =
                NackReason::from_code(code).ok_or(WireError::UnknownNackReason { found: code })?;
            ControlMessage::Nack {
                epoch,
                tier,
                reason,
            }
        }
        MessageKind::Released => ControlMessage::Released { epoch },
        MessageKind::Abandon => ControlMessage::Abandon { epoch },
    };
    message.validate()?;
    Ok((message, frame_len))
}

/// Writes into a frame whose length was checked against the message kind beforehand.
struct Writer<'a> {
    frame: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.frame[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }
}

/// Reads fixed-size fields, reporting a short input as [`WireError::Truncated`].
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let field = self
            .bytes
            .get(self.pos..self.pos + N)
            .and_then(|slice| <[u8; N]>::try_from(slice).ok())
            .ok_or(WireError::Truncated {
                needed: self.pos + N,
                available: self.bytes.len(),
            })?;
        self.pos += N;
        Ok(field)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn epoch() -> impl Strategy<Value = Epoch> {
        (1..=u64::MAX).prop_map(Epoch::new)
    }

    fn tier() -> impl Strategy<Value = TierIndex> {
        any::<u8>().prop_map(TierIndex::new)
    }

    fn reason() -> impl Strategy<Value = NackReason> {
        prop_oneof![
            Just(NackReason::OverBudget),
            Just(NackReason::BeyondLadder),
            Just(NackReason::Busy),
        ]
    }

    fn message() -> impl Strategy<Value = ControlMessage> {
        prop_oneof![
            (epoch(), tier(), any::<u64>()).prop_map(|(epoch, tier, current)| {
                ControlMessage::Request {
                    epoch,
                    tier,
                    current: Epoch::new(current),
                }
            }),
            (
                epoch(),
                tier(),
                1..=u32::MAX,
                1..=u32::MAX,
                any::<(u64, u64, u32)>()
            )
                .prop_map(|(epoch, tier, slot_size, slot_count, (addr, len, key))| {
                    ControlMessage::Ack {
                        epoch,
                        tier,
                        shape: TierShape {
                            slot_size,
                            slot_count,
                        },
                        region: RegionDescriptor {
                            addr,
                            len,
                            remote_key: key,
                        },
                    }
                }),
            (epoch(), tier(), reason()).prop_map(|(epoch, tier, reason)| ControlMessage::Nack {
                epoch,
                tier,
                reason
            }),
            epoch().prop_map(|epoch| ControlMessage::Released { epoch }),
            epoch().prop_map(|epoch| ControlMessage::Abandon { epoch }),
        ]
    }

    fn encoded(message: &ControlMessage) -> Vec<u8> {
        let mut frame = vec![0; MAX_FRAME_LEN];
        let len = encode(message, &mut frame).expect("valid message encodes");
        frame.truncate(len);
        frame
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_message_round_trips(message in message()) {
            let frame = encoded(&message);
            prop_assert_eq!(frame.len(), message.kind().frame_len());
            prop_assert_eq!(decode(&frame), Ok(message));
            let mut slot = frame.clone();
            slot.resize(MAX_FRAME_LEN + 17, 0xAB);
            prop_assert_eq!(
                try_decode(&slot),
                Ok(FrameStatus::Complete { message, frame_len: frame.len() })
            );
        }

        #[test]
        fn random_bytes_never_panic_and_decode_only_to_encodable_messages(
            bytes in proptest::collection::vec(any::<u8>(), 0..80)
        ) {
            if let Ok(message) = decode(&bytes) {
                prop_assert_eq!(&encoded(&message), &bytes);
            }
            if let Ok(FrameStatus::Complete { message, frame_len }) = try_decode(&bytes) {
                let reencoded = encoded(&message);
                prop_assert_eq!(reencoded.as_slice(), &bytes[..frame_len]);
            }
        }

        #[test]
        fn every_truncation_is_incomplete(message in message()) {
            let frame = encoded(&message);
            for len in 0..frame.len() {
                let error = decode(&frame[..len]).unwrap_err();
                prop_assert!(error.is_incomplete(), "prefix {} gave {:?}", len, error);
                prop_assert_eq!(try_decode(&frame[..len]), Ok(FrameStatus::Incomplete));
            }
        }

        #[test]
        fn a_write_in_progress_is_never_taken_for_a_whole_frame(message in message()) {
            let frame = encoded(&message);
            let mut slot = vec![0u8; 64];
            // The peer's write lands front to back; before the tail's last byte is written,
            // the frame must read as incomplete.
            for written in 0..frame.len() - 1 {
                slot[..written].copy_from_slice(&frame[..written]);
                prop_assert_eq!(try_decode(&slot), Ok(FrameStatus::Incomplete), "{} bytes", written);
            }
        }

        #[test]
        fn every_bit_flip_is_rejected_or_decodes_to_an_encodable_message(
            message in message(),
            bit in 0usize..(MAX_FRAME_LEN * 8),
        ) {
            let mut frame = encoded(&message);
            let bit = bit % (frame.len() * 8);
            frame[bit / 8] ^= 1 << (bit % 8);
            // Which error a flip causes depends on the bit; that it is an error and not a
            // panic is the point. A flip that still decodes must yield another message.
            if let Ok(decoded) = decode(&frame) {
                prop_assert_ne!(decoded, message);
                prop_assert_eq!(encoded(&decoded), frame);
            }
        }
    }

    fn ack() -> ControlMessage {
        ControlMessage::Ack {
            epoch: Epoch::new(4),
            tier: TierIndex::new(1),
            shape: TierShape {
                slot_size: 8192,
                slot_count: 16,
            },
            region: RegionDescriptor {
                addr: 0x1000,
                len: 8192 * 16,
                remote_key: 7,
            },
        }
    }

    #[test]
    fn the_largest_frame_is_an_ack_and_fits_the_smallest_tier() {
        assert_eq!(encoded(&ack()).len(), MAX_FRAME_LEN);
        assert_eq!(MAX_FRAME_LEN, 45);
    }

    #[test]
    fn layout_is_little_endian_with_flags_at_both_ends() {
        let frame = encoded(&ControlMessage::Released {
            epoch: Epoch::new(0x0102),
        });
        assert_eq!(
            frame,
            [
                0x7E, 0xB1, 1, 4, 8, 0, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 0xA1, 0xE7
            ]
        );
    }

    #[test]
    fn each_malformation_gets_its_own_error() {
        let good = encoded(&ack());
        let with = |at: usize, value: u8| {
            let mut frame = good.clone();
            frame[at] = value;
            decode(&frame)
        };
        assert_eq!(with(0, 0x00), Err(WireError::BadHeadFlag { found: 0xB100 }));
        assert_eq!(with(2, 9), Err(WireError::UnsupportedVersion { found: 9 }));
        assert_eq!(
            with(3, 77),
            Err(WireError::UnknownMessageType { found: 77 })
        );
        assert_eq!(
            with(3, MessageKind::Nack.code()),
            Err(WireError::BodyLengthMismatch {
                kind: MessageKind::Nack,
                expected: 10,
                found: 37
            })
        );
        assert_eq!(
            with(4, 200),
            Err(WireError::BodyTooLong {
                found: 200,
                max: 37
            })
        );
        assert_eq!(
            with(good.len() - 1, 0x12),
            Err(WireError::BadTailFlag { found: 0x12A1 })
        );
        assert_eq!(
            with(good.len() - 2, 0),
            Err(WireError::BadTailFlag { found: 0xE700 }),
            "only the second byte of the tail written: not a front-to-back write in progress"
        );
        assert_eq!(
            with(good.len() - 1, 0),
            Err(WireError::TornFrame {
                frame_len: good.len()
            }),
            "the first byte of the tail written, the second not yet"
        );
        // slot size is at body offset 9, i.e. frame offset 15..19
        let mut zero_size = good.clone();
        zero_size[15..19].fill(0);
        assert_eq!(decode(&zero_size), Err(WireError::ZeroSlotSize));
        let mut zero_count = good.clone();
        zero_count[19..23].fill(0);
        assert_eq!(decode(&zero_count), Err(WireError::ZeroSlotCount));
        let mut zero_epoch = good.clone();
        zero_epoch[6..14].fill(0);
        assert_eq!(
            decode(&zero_epoch),
            Err(WireError::ZeroEpoch {
                kind: MessageKind::Ack
            })
        );
        let mut nack = encoded(&ControlMessage::Nack {
            epoch: Epoch::new(1),
            tier: TierIndex::new(3),
            reason: NackReason::Busy,
        });
        nack[15] = 0;
        assert_eq!(
            decode(&nack),
            Err(WireError::UnknownNackReason { found: 0 })
        );
    }

    #[test]
    fn a_torn_frame_is_incomplete_not_malformed() {
        let mut frame = encoded(&ack());
        let len = frame.len();
        frame[len - 2..].fill(0);
        assert_eq!(decode(&frame), Err(WireError::TornFrame { frame_len: len }));
        assert_eq!(try_decode(&frame), Ok(FrameStatus::Incomplete));
        assert_eq!(try_decode(&[0; 64]), Ok(FrameStatus::Incomplete));
    }

    #[test]
    fn encode_refuses_what_decode_would_refuse() {
        let mut out = [0u8; MAX_FRAME_LEN];
        let ControlMessage::Ack { region, .. } = ack() else {
            unreachable!()
        };
        let zero_size = ControlMessage::Ack {
            epoch: Epoch::new(1),
            tier: TierIndex::new(1),
            shape: TierShape {
                slot_size: 0,
                slot_count: 4,
            },
            region,
        };
        assert_eq!(encode(&zero_size, &mut out), Err(WireError::ZeroSlotSize));
        assert_eq!(
            encode(
                &ControlMessage::Abandon {
                    epoch: Epoch::INITIAL
                },
                &mut out
            ),
            Err(WireError::ZeroEpoch {
                kind: MessageKind::Abandon
            })
        );
        assert_eq!(
            encode(&ack(), &mut out[..10]),
            Err(WireError::BufferTooSmall {
                needed: 45,
                available: 10
            })
        );
        assert_eq!(out, [0; MAX_FRAME_LEN], "a refused encode writes nothing");
    }
}
