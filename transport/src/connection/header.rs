//! The 16-byte header every frame of a connection starts with (see `docs/connection.md`).
//!
//! # Invariants
//!
//! - [`FrameHeader::decode`] accepts only what [`FrameHeader::encode`] can produce: a known
//!   kind, a message length only on the kinds that carry one, a whole-message length that
//!   equals the payload, a packed frame's count of messages that its payload can hold
//!   (at least one, and no more than one per [`PACKED_ENTRY_HEAD`] bytes), and a payload
//!   that fits the bytes received. Everything else is a [`HeaderError`], never a panic.
//!   A packed frame's entries are checked by `packed.rs`.

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 16;

/// Bytes of the head of each entry of a packed frame: the message's length (`u32`, little
/// endian) and four zero bytes. A message's bytes follow it, padded with zeros to a
/// multiple of eight, so every message in a packed frame starts 8-byte aligned.
pub const PACKED_ENTRY_HEAD: usize = 8;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A whole message.
    Whole = 1,
    /// The first segment of a message; the header carries the message's total length.
    First = 2,
    /// A segment between the first and the last.
    Middle = 3,
    /// The last segment of a message.
    Last = 4,
    /// A negotiation frame (`tierbuf_tiers::wire`).
    Control = 5,
    /// Only the grant in the header.
    Credit = 6,
    /// Consumes an old tier's receive after a switch; only the grant in the header.
    Drain = 7,
    /// Several whole messages, each in an entry of its own (`docs/connection.md`); the
    /// header's message length is their count.
    Packed = 8,
    /// A whole message exposed for the peer to read (`docs/protocol.md`, "Rendezvous"):
    /// the payload is its descriptor ([`EXPOSED_LEN`] bytes), the header's message length
    /// the message's.
    Exposed = 9,
    /// The peer read the message it was exposed: the payload names the exposure
    /// ([`READ_ANSWER_LEN`] bytes).
    ReadDone = 10,
    /// The peer could not read the message it was exposed (it could not register a
    /// buffer for it) and asks for it in segments: the payload names the exposure
    /// ([`READ_ANSWER_LEN`] bytes).
    ReadRefused = 11,
}

/// Bytes of an [`FrameKind::Exposed`] frame's payload: the exposure's key (`u32`), the
/// range's length (`u32`) and its address (`u64`), little endian.
pub const EXPOSED_LEN: usize = 16;

/// Bytes of a [`FrameKind::ReadDone`] or [`FrameKind::ReadRefused`] frame's payload: the
/// exposure's key and length (`u32` each, little endian).
pub const READ_ANSWER_LEN: usize = 8;

impl FrameKind {
    /// Whether a frame of this kind carries (part of) a message.
    pub(super) fn carries_data(self) -> bool {
        matches!(
            self,
            FrameKind::Whole
                | FrameKind::First
                | FrameKind::Middle
                | FrameKind::Last
                | FrameKind::Packed
                | FrameKind::Exposed
        )
    }

    fn from_byte(byte: u8) -> Option<FrameKind> {
        Some(match byte {
            1 => FrameKind::Whole,
            2 => FrameKind::First,
            3 => FrameKind::Middle,
            4 => FrameKind::Last,
            5 => FrameKind::Control,
            6 => FrameKind::Credit,
            7 => FrameKind::Drain,
            8 => FrameKind::Packed,
            9 => FrameKind::Exposed,
            10 => FrameKind::ReadDone,
            11 => FrameKind::ReadRefused,
            _ => return None,
        })
    }
}

/// A run of receives the sender of the frame has posted: `count` buffers of `tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The tier of the posted receives.
    pub(crate) tier: u8,
    /// How many were posted.
    pub(crate) count: u16,
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// What the frame carries.
    pub(crate) kind: FrameKind,
    /// Receives granted to the peer by this frame (`count` 0: none).
    pub(crate) grant: Grant,
    /// Bytes of payload after the header.
    pub(crate) payload_len: u32,
    /// The whole message's length, on `Whole` and `First` frames; 0 otherwise.
    pub(crate) message_len: u64,
}

/// Why a frame header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer bytes than a header arrived.
    #[error("frame of {len} bytes is shorter than its {HEADER_LEN}-byte header")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// The kind byte names no frame kind.
    #[error("unknown frame kind {kind}")]
    UnknownKind {
        /// The byte found.
        kind: u8,
    },
    /// The payload length passes the bytes received.
    #[error(
        "payload of {payload_len} bytes does not fit the {available} bytes received after the header"
    )]
    PayloadPastFrame {
        /// The payload length in the header.
        payload_len: u32,
        /// Bytes after the header.
        available: usize,
    },
    /// A message length on a kind that carries none, a whole message whose length is not
    /// its payload's, or a packed frame whose count of messages its payload cannot hold.
    #[error("{kind:?} frame with message length {message_len} and payload {payload_len}")]
    InconsistentLength {
        /// The frame's kind.
        kind: FrameKind,
        /// The message length in the header.
        message_len: u64,
        /// The payload length in the header.
        payload_len: u32,
    },
    /// A frame kind whose payload has a fixed length (none, or a descriptor's) carries
    /// another.
    #[error("{kind:?} frame carries {payload_len} payload bytes")]
    UnexpectedPayload {
        /// The frame's kind.
        kind: FrameKind,
        /// The payload length in the header.
        payload_len: u32,
    },
}

impl FrameHeader {
    /// A header with no grant yet (the oldest pending grant is written in when the frame
    /// is posted).
    const fn ungranted(kind: FrameKind, payload_len: usize, message_len: usize) -> FrameHeader {
        FrameHeader {
            kind,
            grant: Grant { tier: 0, count: 0 },
            payload_len: payload_len as u32,
            message_len: message_len as u64,
        }
    }

    /// A whole message of `len` bytes in one frame.
    pub(super) const fn whole(len: usize) -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Whole, len, len)
    }

    /// The segment of `chunk` bytes at offset `sent` of a message of `total` bytes.
    pub(super) const fn segment(sent: usize, chunk: usize, total: usize) -> FrameHeader {
        if sent == 0 {
            FrameHeader::ungranted(FrameKind::First, chunk, total)
        } else if sent + chunk == total {
            FrameHeader::ungranted(FrameKind::Last, chunk, 0)
        } else {
            FrameHeader::ungranted(FrameKind::Middle, chunk, 0)
        }
    }

    /// A packed frame of `count` messages in `len` bytes of entries.
    pub(super) const fn packed(len: usize, count: usize) -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Packed, len, count)
    }

    /// A control frame of `len` encoded bytes.
    pub(super) const fn control(len: usize) -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Control, len, 0)
    }

    /// A frame that only returns credits.
    pub(super) const fn credit() -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Credit, 0, 0)
    }

    /// A frame that consumes one of the peer's receives of a replaced tier.
    pub(super) const fn drain() -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Drain, 0, 0)
    }

    /// A message of `len` bytes exposed for the peer to read.
    pub(super) const fn exposed(len: usize) -> FrameHeader {
        FrameHeader::ungranted(FrameKind::Exposed, EXPOSED_LEN, len)
    }

    /// This side's answer to a message the peer exposed: `ReadDone` or `ReadRefused`.
    pub(super) const fn read_answer(kind: FrameKind) -> FrameHeader {
        FrameHeader::ungranted(kind, READ_ANSWER_LEN, 0)
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    ///
    /// If `out` is shorter than [`HEADER_LEN`]: callers write into receive-sized slots,
    /// which every tier makes longer than a header.
    pub(crate) fn encode(&self, out: &mut [u8]) {
        out[0] = self.kind as u8;
        out[1] = self.grant.tier;
        out[2..4].copy_from_slice(&self.grant.count.to_le_bytes());
        out[4..8].copy_from_slice(&self.payload_len.to_le_bytes());
        out[8..16].copy_from_slice(&self.message_len.to_le_bytes());
    }

    /// Reads and validates the header at the start of `frame` (the bytes one receive
    /// completion reported).
    pub(crate) fn decode(frame: &[u8]) -> Result<FrameHeader, HeaderError> {
        let Some(bytes) = frame.first_chunk::<HEADER_LEN>() else {
            return Err(HeaderError::Truncated { len: frame.len() });
        };
        let [kind, tier, c0, c1, p0, p1, p2, p3, message_len @ ..] = *bytes;
        let kind = FrameKind::from_byte(kind).ok_or(HeaderError::UnknownKind { kind })?;
        let grant = Grant {
            tier,
            count: u16::from_le_bytes([c0, c1]),
        };
        let payload_len = u32::from_le_bytes([p0, p1, p2, p3]);
        let message_len = u64::from_le_bytes(message_len);
        let available = frame.len() - HEADER_LEN;
        if payload_len as usize > available {
            return Err(HeaderError::PayloadPastFrame {
                payload_len,
                available,
            });
        }
        let inconsistent = match kind {
            FrameKind::Whole => message_len != u64::from(payload_len),
            FrameKind::First => message_len <= u64::from(payload_len),
            FrameKind::Packed => {
                message_len == 0 || message_len > u64::from(payload_len) / PACKED_ENTRY_HEAD as u64
            }
            FrameKind::Exposed => message_len == 0,
            _ => message_len != 0,
        };
        if inconsistent {
            return Err(HeaderError::InconsistentLength {
                kind,
                message_len,
                payload_len,
            });
        }
        let fixed = match kind {
            FrameKind::Credit | FrameKind::Drain => Some(0),
            FrameKind::Exposed => Some(EXPOSED_LEN as u32),
            FrameKind::ReadDone | FrameKind::ReadRefused => Some(READ_ANSWER_LEN as u32),
            _ => None,
        };
        if fixed.is_some_and(|fixed| payload_len != fixed) {
            return Err(HeaderError::UnexpectedPayload { kind, payload_len });
        }
        Ok(FrameHeader {
            kind,
            grant,
            payload_len,
            message_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(kind: FrameKind, payload_len: u32, message_len: u64) -> FrameHeader {
        FrameHeader {
            kind,
            grant: Grant {
                tier: 2,
                count: 513,
            },
            payload_len,
            message_len,
        }
    }

    fn frame(header: &FrameHeader, extra: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_LEN + header.payload_len as usize + extra];
        header.encode(&mut bytes);
        bytes
    }

    #[test]
    fn every_valid_kind_round_trips() {
        for header in [
            header(FrameKind::Whole, 100, 100),
            header(FrameKind::Whole, 0, 0),
            header(FrameKind::First, 100, 1 << 40),
            header(FrameKind::Middle, 100, 0),
            header(FrameKind::Last, 1, 0),
            header(FrameKind::Control, 45, 0),
            header(FrameKind::Credit, 0, 0),
            header(FrameKind::Drain, 0, 0),
            header(FrameKind::Packed, 16, 2),
            header(FrameKind::Exposed, EXPOSED_LEN as u32, 1 << 20),
            header(FrameKind::ReadDone, READ_ANSWER_LEN as u32, 0),
            header(FrameKind::ReadRefused, READ_ANSWER_LEN as u32, 0),
        ] {
            assert_eq!(FrameHeader::decode(&frame(&header, 7)), Ok(header));
        }
    }

    #[test]
    fn malformed_headers_are_refused() {
        assert_eq!(
            FrameHeader::decode(&[1; 15]),
            Err(HeaderError::Truncated { len: 15 })
        );
        let mut unknown = frame(&header(FrameKind::Credit, 0, 0), 0);
        unknown[0] = 0;
        assert_eq!(
            FrameHeader::decode(&unknown),
            Err(HeaderError::UnknownKind { kind: 0 })
        );
        let mut past = frame(&header(FrameKind::Whole, 10, 10), 0);
        past.truncate(HEADER_LEN + 9);
        assert!(matches!(
            FrameHeader::decode(&past),
            Err(HeaderError::PayloadPastFrame {
                payload_len: 10,
                available: 9
            })
        ));
        for bad in [
            header(FrameKind::Whole, 10, 11),
            header(FrameKind::First, 10, 10),
            header(FrameKind::Middle, 10, 5),
            header(FrameKind::Control, 10, 1),
            header(FrameKind::Packed, 16, 0),
            header(FrameKind::Packed, 16, 3),
            header(FrameKind::Exposed, EXPOSED_LEN as u32, 0),
            header(FrameKind::ReadDone, READ_ANSWER_LEN as u32, 8),
        ] {
            assert!(matches!(
                FrameHeader::decode(&frame(&bad, 0)),
                Err(HeaderError::InconsistentLength { .. })
            ));
        }
        for bad in [
            header(FrameKind::Drain, 3, 0),
            header(FrameKind::Exposed, 15, 100),
            header(FrameKind::ReadDone, 0, 0),
        ] {
            assert!(matches!(
                FrameHeader::decode(&frame(&bad, 0)),
                Err(HeaderError::UnexpectedPayload { .. })
            ));
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(header) = FrameHeader::decode(&bytes) {
                prop_assert!(HEADER_LEN + header.payload_len as usize <= bytes.len());
                let mut again = vec![0u8; HEADER_LEN];
                header.encode(&mut again);
                prop_assert_eq!(&again[..], &bytes[..HEADER_LEN]);
            }
        }
    }
}
