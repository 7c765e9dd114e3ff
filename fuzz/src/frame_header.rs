//! Target `frame_header`: the 16-byte header every connection frame starts with
//! (`transport/src/connection/header.rs`, `docs/connection.md`, "Frame header"), through
//! the `fuzzing` feature's wrappers.
//!
//! Every input is read two ways.
//!
//! - **As a received frame.** Decoding never panics. A header it accepts re-encodes to
//!   exactly the input's first 16 bytes, its payload fits the bytes after it, and it keeps
//!   the kinds' rules ([`keeps_the_rules`]). A refusal names what the bytes hold:
//!   `Truncated` exactly when fewer than 16 bytes came, and the kind and lengths any other
//!   refusal reports are those of the bytes, which indeed break the rule it names.
//! - **As header fields** (the kind, grant, payload length and a message length chosen
//!   from the input). A frame written with them, with room for its payload, decodes to the
//!   same fields exactly when they keep the kinds' rules; one byte of payload short, it is
//!   refused as `PayloadPastFrame`.

use tierbuf_tiers::wire::{ControlMessage, Epoch};
use tierbuf_transport::connection::{
    EXPOSED_LEN, FrameKind, HEADER_LEN, HeaderError, PACKED_ENTRY_HEAD, READ_ANSWER_LEN,
};
use tierbuf_transport::fuzzing::{FrameHeaderFields, decode_frame_header, encode_frame_header};

use crate::reader::{Reader, padded};

/// Runs one input (module documentation).
pub fn run(data: &[u8]) {
    check_received(data);
    check_sent(data);
}

/// Whether a header keeps the rules of its kind: a whole message's length is its
/// payload's, a first segment's is longer than its payload, a packed frame counts at least
/// one message and no more than one per entry head its payload could hold, an exposed
/// message has a length, other kinds carry no message length; credit and drain frames
/// carry no payload, an exposed message's is its descriptor and a read's answer its
/// own, each of a fixed length.
pub(crate) fn keeps_the_rules(header: &FrameHeaderFields) -> bool {
    let payload = u64::from(header.payload_len);
    let length_ok = match header.kind {
        FrameKind::Whole => header.message_len == payload,
        FrameKind::First => header.message_len > payload,
        FrameKind::Packed => (1..=payload / PACKED_ENTRY_HEAD as u64).contains(&header.message_len),
        FrameKind::Exposed => header.message_len > 0,
        _ => header.message_len == 0,
    };
    let payload_ok = match header.kind {
        FrameKind::Credit | FrameKind::Drain => payload == 0,
        FrameKind::Exposed => payload == EXPOSED_LEN as u64,
        FrameKind::ReadDone | FrameKind::ReadRefused => payload == READ_ANSWER_LEN as u64,
        _ => true,
    };
    length_ok && payload_ok
}

/// The input as a frame a peer sent.
fn check_received(frame: &[u8]) {
    let decoded = decode_frame_header(frame);
    let Some(head) = frame.first_chunk::<HEADER_LEN>() else {
        assert_eq!(decoded, Err(HeaderError::Truncated { len: frame.len() }));
        return;
    };
    let available = frame.len() - HEADER_LEN;
    let payload_in_bytes = u32::from_le_bytes(head[4..8].try_into().unwrap());
    let message_in_bytes = u64::from_le_bytes(head[8..16].try_into().unwrap());
    match decoded {
        Ok(header) => {
            assert_eq!(&encode_frame_header(&header), head);
            assert!(header.payload_len as usize <= available);
            assert!(keeps_the_rules(&header), "accepted {header:?}");
        }
        Err(HeaderError::UnknownKind { kind }) => {
            assert_eq!(kind, head[0]);
            assert!(!(1..=KINDS.len() as u8).contains(&kind));
        }
        Err(HeaderError::PayloadPastFrame {
            payload_len,
            available: reported,
        }) => {
            assert_eq!((payload_len, reported), (payload_in_bytes, available));
            assert!(payload_len as usize > available);
        }
        Err(HeaderError::InconsistentLength {
            kind,
            message_len,
            payload_len,
        }) => {
            assert_eq!(message_len, message_in_bytes);
            assert_breaks_the_rules(head, kind, payload_len, payload_in_bytes);
        }
        Err(HeaderError::UnexpectedPayload { kind, payload_len }) => {
            assert_breaks_the_rules(head, kind, payload_len, payload_in_bytes);
        }
        Err(other) => panic!("{other:?} for a frame of {} bytes", frame.len()),
    }
}

/// Checks a refusal for breaking the kinds' rules: the kind and payload length it reports
/// are those of `head`, whose fields indeed break them.
fn assert_breaks_the_rules(
    head: &[u8; HEADER_LEN],
    kind: FrameKind,
    payload_len: u32,
    payload_in_bytes: u32,
) {
    assert_eq!(kind as u8, head[0]);
    assert_eq!(payload_len, payload_in_bytes);
    let header = FrameHeaderFields {
        kind,
        grant_tier: head[1],
        grant_count: u16::from_le_bytes([head[2], head[3]]),
        payload_len,
        message_len: u64::from_le_bytes(head[8..16].try_into().unwrap()),
    };
    assert!(!keeps_the_rules(&header), "refused {header:?}");
}

/// The frame kinds, in the order [`read_fields`] numbers them (which is their wire
/// numbering, less one).
const KINDS: [FrameKind; 11] = [
    FrameKind::Whole,
    FrameKind::First,
    FrameKind::Middle,
    FrameKind::Last,
    FrameKind::Control,
    FrameKind::Credit,
    FrameKind::Drain,
    FrameKind::Packed,
    FrameKind::Exposed,
    FrameKind::ReadDone,
    FrameKind::ReadRefused,
];

/// The longest run of bytes [`read_fields`] reads.
const FIELDS_LEN: usize = 1 + 1 + 2 + 2 + 1 + 8;

/// Header fields read from an input: the kind, the grant's tier and count, a payload
/// length of at most `u16::MAX`, and a message length chosen by a mode byte among those
/// the kinds' rules turn on (the payload's, none, past the payload, a count of packed
/// entries near the most the payload holds) and any other.
pub(crate) fn read_fields(fields: &mut Reader<'_>) -> Option<FrameHeaderFields> {
    let kind = KINDS[usize::from(fields.u8()?) % KINDS.len()];
    let grant_tier = fields.u8()?;
    let grant_count = fields.u16()?;
    let payload_len = u32::from(fields.u16()?);
    let message_len = match fields.u8()? % 5 {
        0 => u64::from(payload_len),
        1 => 0,
        2 => u64::from(payload_len) + 1 + u64::from(fields.u8()?),
        3 => fields.u64()?,
        _ => (u64::from(payload_len) / PACKED_ENTRY_HEAD as u64 + 1)
            .saturating_sub(u64::from(fields.u8()? % 4)),
    };
    Some(FrameHeaderFields {
        kind,
        grant_tier,
        grant_count,
        payload_len,
        message_len,
    })
}

/// Appends `header` as [`read_fields`] reads it (the payload length cut to a `u16`).
pub(crate) fn write_fields(header: &FrameHeaderFields, out: &mut Vec<u8>) {
    let kind = KINDS
        .iter()
        .position(|&kind| kind == header.kind)
        .expect("every kind is listed");
    out.extend_from_slice(&[kind as u8, header.grant_tier]);
    out.extend_from_slice(&header.grant_count.to_le_bytes());
    out.extend_from_slice(&(header.payload_len as u16).to_le_bytes());
    out.push(3);
    out.extend_from_slice(&header.message_len.to_le_bytes());
}

/// The input as the fields of a header this side writes.
fn check_sent(data: &[u8]) {
    let fields = padded::<FIELDS_LEN>(data);
    let header = read_fields(&mut Reader::new(&fields)).expect("the fields are padded");
    let payload_len = header.payload_len;
    let mut bytes = vec![0u8; HEADER_LEN + payload_len as usize];
    bytes[..HEADER_LEN].copy_from_slice(&encode_frame_header(&header));
    let decoded = decode_frame_header(&bytes);
    if keeps_the_rules(&header) {
        assert_eq!(decoded, Ok(header));
    } else {
        assert!(decoded.is_err(), "accepted {header:?}");
    }
    if payload_len > 0 {
        assert_eq!(
            decode_frame_header(&bytes[..bytes.len() - 1]),
            Err(HeaderError::PayloadPastFrame {
                payload_len,
                available: payload_len as usize - 1
            })
        );
    }
}

/// A frame of `kind` granting `grant` (tier, count), with `message_len` and `payload`.
pub(crate) fn frame(
    kind: FrameKind,
    grant: (u8, u16),
    message_len: u64,
    payload: &[u8],
) -> Vec<u8> {
    let header = FrameHeaderFields {
        kind,
        grant_tier: grant.0,
        grant_count: grant.1,
        payload_len: u32::try_from(payload.len()).expect("a seed payload fits a u32"),
        message_len,
    };
    let mut frame = encode_frame_header(&header).to_vec();
    frame.extend_from_slice(payload);
    frame
}

/// The seeds: a frame of each kind, as a connection sends it.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let control = crate::control_codec::frame(&ControlMessage::Released {
        epoch: Epoch::new(1),
    })
    .expect("a seed message encodes");
    vec![
        ("whole", frame(FrameKind::Whole, (0, 1), 5, b"hello")),
        ("first", frame(FrameKind::First, (0, 0), 300, &[1; 100])),
        ("middle", frame(FrameKind::Middle, (1, 2), 0, &[2; 100])),
        ("last", frame(FrameKind::Last, (0, 0), 0, &[3; 100])),
        ("control", frame(FrameKind::Control, (0, 1), 0, &control)),
        ("credit", frame(FrameKind::Credit, (2, 4), 0, &[])),
        ("drain", frame(FrameKind::Drain, (0, 0), 0, &[])),
        ("packed", frame(FrameKind::Packed, (0, 1), 2, &[0; 24])),
        (
            "exposed",
            frame(FrameKind::Exposed, (0, 1), 1 << 20, &[5; EXPOSED_LEN]),
        ),
        (
            "read_done",
            frame(FrameKind::ReadDone, (0, 1), 0, &[6; READ_ANSWER_LEN]),
        ),
        (
            "read_refused",
            frame(FrameKind::ReadRefused, (0, 0), 0, &[7; READ_ANSWER_LEN]),
        ),
    ]
}
