//! Target `control_codec`: the negotiation's control-message codec
//! ([`tierbuf_tiers::wire`], `docs/protocol.md`, "Frames").
//!
//! Every input is read two ways.
//!
//! - **As a received frame.** [`wire::decode`] and [`wire::try_decode`] never panic. A frame
//!   `decode` takes re-encodes to exactly the input's bytes and decodes again to the same
//!   message. `try_decode` agrees with it: the same message and length for a whole frame,
//!   the frame at the front when bytes trail it, `Incomplete` exactly for the errors that
//!   say the bytes may still become a frame (`WireError::is_incomplete`), the same error
//!   otherwise.
//! - **As the fields of a message** (its type, epoch, tier, ...). [`wire::encode`] refuses
//!   exactly what the codec promises never to carry (epoch 0; an ack of zero slots, or of
//!   zero-byte slots) and a buffer one byte short of the frame. A frame it writes is the
//!   kind's length, at most [`MAX_FRAME_LEN`], and decodes to the same message; and every
//!   proper prefix of it in a zeroed receive slot (a write still in progress: the patent's
//!   torn ack) reads as `Incomplete`, never as a message or an error.

use tierbuf_tiers::negotiation::TierShape;
use tierbuf_tiers::wire::{
    self, ControlMessage, Epoch, FrameStatus, MAX_FRAME_LEN, NackReason, WireError,
};
use tierbuf_tiers::{RegionDescriptor, TierIndex};

use crate::reader::{Reader, padded};

/// Runs one input (module documentation).
pub fn run(data: &[u8]) {
    check_received(data);
    check_sent(&message_from(data));
}

/// The input as a frame a peer sent.
fn check_received(bytes: &[u8]) {
    let status = wire::try_decode(bytes);
    match wire::decode(bytes) {
        Ok(message) => {
            let mut frame = [0u8; MAX_FRAME_LEN];
            let len = wire::encode(&message, &mut frame).expect("a decoded message encodes");
            assert_eq!(
                &frame[..len],
                bytes,
                "{message:?} re-encodes to other bytes"
            );
            assert_eq!(wire::decode(&frame[..len]), Ok(message));
            assert_eq!(
                status,
                Ok(FrameStatus::Complete {
                    message,
                    frame_len: len
                })
            );
        }
        Err(WireError::TrailingBytes { frame_len, extra }) => {
            assert_eq!(frame_len + extra, bytes.len());
            let front = wire::decode(&bytes[..frame_len]).expect("the frame before the trail");
            assert_eq!(
                status,
                Ok(FrameStatus::Complete {
                    message: front,
                    frame_len
                })
            );
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            if error.is_incomplete() {
                assert_eq!(status, Ok(FrameStatus::Incomplete), "after {error:?}");
            } else {
                assert_eq!(status, Err(error));
            }
        }
    }
}

/// The input as the fields of a message this side sends.
fn check_sent(message: &ControlMessage) {
    let mut frame = [0u8; MAX_FRAME_LEN + 1];
    let refusal = if message.epoch() == Epoch::INITIAL {
        Some(WireError::ZeroEpoch {
            kind: message.kind(),
        })
    } else if let ControlMessage::Ack { shape, .. } = message {
        if shape.slot_size == 0 {
            Some(WireError::ZeroSlotSize)
        } else if shape.slot_count == 0 {
            Some(WireError::ZeroSlotCount)
        } else {
            None
        }
    } else {
        None
    };
    let encoded = wire::encode(message, &mut frame);
    if let Some(refusal) = refusal {
        assert_eq!(encoded, Err(refusal));
        return;
    }
    let len = encoded.unwrap_or_else(|error| panic!("{message:?} refused: {error}"));
    assert_eq!(len, message.kind().frame_len());
    assert!(len <= MAX_FRAME_LEN);
    assert_eq!(wire::decode(&frame[..len]), Ok(*message));
    assert_eq!(
        wire::encode(message, &mut [0u8; MAX_FRAME_LEN][..len - 1]),
        Err(WireError::BufferTooSmall {
            needed: len,
            available: len - 1
        })
    );
    // A slot the peer is writing front to back: zeroed, then a prefix of the frame.
    const SLOT: usize = 64;
    for written in 0..len {
        let mut slot = [0u8; SLOT];
        slot[..written].copy_from_slice(&frame[..written]);
        assert_eq!(
            wire::try_decode(&slot),
            Ok(FrameStatus::Incomplete),
            "{written} of {len} bytes of {message:?} written"
        );
    }
    let mut slot = [0u8; SLOT];
    slot[..len].copy_from_slice(&frame[..len]);
    assert_eq!(
        wire::try_decode(&slot),
        Ok(FrameStatus::Complete {
            message: *message,
            frame_len: len
        })
    );
}

/// The longest run of fields [`read_message`] reads.
const MESSAGE_FIELDS_LEN: usize = 1 + 8 + 1 + 4 + 4 + 8 + 8 + 4;

/// A message made of the input's bytes read as fields (zero past its end).
fn message_from(bytes: &[u8]) -> ControlMessage {
    let fields = padded::<MESSAGE_FIELDS_LEN>(bytes);
    read_message(&mut Reader::new(&fields)).expect("the fields are padded")
}

/// A message read as fields: its type, epoch and tier, then the type's other fields.
pub(crate) fn read_message(fields: &mut Reader<'_>) -> Option<ControlMessage> {
    let kind = fields.u8()?;
    let epoch = Epoch::new(fields.u64()?);
    let tier = TierIndex::new(fields.u8()?);
    Some(match kind % 5 {
        0 => ControlMessage::Request {
            epoch,
            tier,
            current: Epoch::new(fields.u64()?),
        },
        1 => ControlMessage::Ack {
            epoch,
            tier,
            shape: TierShape {
                slot_size: fields.u32()?,
                slot_count: fields.u32()?,
            },
            region: RegionDescriptor {
                addr: fields.u64()?,
                len: fields.u64()?,
                remote_key: fields.u32()?,
            },
        },
        2 => ControlMessage::Nack {
            epoch,
            tier,
            reason: [
                NackReason::OverBudget,
                NackReason::BeyondLadder,
                NackReason::Busy,
            ][usize::from(fields.u8()? % 3)],
        },
        3 => ControlMessage::Released { epoch },
        _ => ControlMessage::Abandon { epoch },
    })
}

/// Appends `message` as [`read_message`] reads it.
pub(crate) fn write_message(message: &ControlMessage, out: &mut Vec<u8>) {
    let (kind, tier) = match *message {
        ControlMessage::Request { tier, .. } => (0, tier),
        ControlMessage::Ack { tier, .. } => (1, tier),
        ControlMessage::Nack { tier, .. } => (2, tier),
        ControlMessage::Released { .. } => (3, TierIndex::SMALLEST),
        ControlMessage::Abandon { .. } => (4, TierIndex::SMALLEST),
    };
    out.push(kind);
    out.extend_from_slice(&message.epoch().get().to_le_bytes());
    out.push(tier.get());
    match *message {
        ControlMessage::Request { current, .. } => {
            out.extend_from_slice(&current.get().to_le_bytes());
        }
        ControlMessage::Ack { shape, region, .. } => {
            out.extend_from_slice(&shape.slot_size.to_le_bytes());
            out.extend_from_slice(&shape.slot_count.to_le_bytes());
            out.extend_from_slice(&region.addr.to_le_bytes());
            out.extend_from_slice(&region.len.to_le_bytes());
            out.extend_from_slice(&region.remote_key.to_le_bytes());
        }
        ControlMessage::Nack { reason, .. } => out.push(reason.code() - 1),
        ControlMessage::Released { .. } | ControlMessage::Abandon { .. } => {}
    }
}

/// A frame of `message`, as this side sends it, unless the codec refuses the message.
pub(crate) fn frame(message: &ControlMessage) -> Option<Vec<u8>> {
    let mut frame = [0u8; MAX_FRAME_LEN];
    let len = wire::encode(message, &mut frame).ok()?;
    Some(frame[..len].to_vec())
}

/// The seeds: a frame of each message type, one with bytes after it, and a torn one.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let frame = |message: &ControlMessage| frame(message).expect("a seed message encodes");
    let ack = frame(&ControlMessage::Ack {
        epoch: Epoch::new(1),
        tier: TierIndex::new(2),
        shape: TierShape {
            slot_size: 8192,
            slot_count: 4,
        },
        region: RegionDescriptor {
            addr: 0x7f00_0000_0000,
            len: 32768,
            remote_key: 9,
        },
    });
    let mut trailing = ack.clone();
    trailing.extend_from_slice(&[0xAA; 3]);
    let torn = ack[..ack.len() - 1].to_vec();
    vec![
        (
            "request",
            frame(&ControlMessage::Request {
                epoch: Epoch::new(1),
                tier: TierIndex::new(2),
                current: Epoch::INITIAL,
            }),
        ),
        ("ack", ack),
        (
            "nack",
            frame(&ControlMessage::Nack {
                epoch: Epoch::new(2),
                tier: TierIndex::new(1),
                reason: NackReason::Busy,
            }),
        ),
        (
            "released",
            frame(&ControlMessage::Released {
                epoch: Epoch::new(1),
            }),
        ),
        (
            "abandon",
            frame(&ControlMessage::Abandon {
                epoch: Epoch::new(3),
            }),
        ),
        ("ack_trailing", trailing),
        ("ack_torn", torn),
    ]
}
