//! Reassembly of segmented messages (see `docs/connection.md`, rule 7).
//!
//! # Invariants
//!
//! - A message is delivered only whole: a `First` frame opens it with its total length,
//!   `Middle` frames add to it, and the `Last` frame must bring it to exactly that length.
//! - Any frame out of that order, or bytes past the announced length, or a length past the
//!   configured maximum, is an error; nothing partial is ever handed out.

use super::header::FrameKind;

/// Why a segment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReassemblyError {
    /// A `Middle` or `Last` frame arrived with no message open.
    #[error("{kind:?} segment with no message open")]
    NoMessageOpen {
        /// The segment's kind.
        kind: FrameKind,
    },
    /// A `First` or `Whole` frame arrived while a segmented message was open.
    #[error("{kind:?} frame while a {expected}-byte message is half received")]
    MessageStillOpen {
        /// The frame's kind.
        kind: FrameKind,
        /// The open message's length.
        expected: u64,
    },
    /// The segments passed, or fell short of, the announced length.
    #[error("segments bring the message to {received} bytes, {expected} were announced")]
    LengthMismatch {
        /// The announced length.
        expected: u64,
        /// The bytes the segments amount to.
        received: u64,
    },
    /// The announced length passes the connection's maximum message length.
    #[error("a {len}-byte message passes the maximum of {max} bytes")]
    TooLong {
        /// The announced length.
        len: u64,
        /// The maximum.
        max: u64,
    },
}

/// A segmented message being received.
#[derive(Debug)]
pub(super) struct Reassembly {
    open: Option<(u64, Vec<u8>)>,
    max_message_len: u64,
}

impl Reassembly {
    /// Reassembly of messages up to `max_message_len` bytes.
    pub(super) fn new(max_message_len: u64) -> Reassembly {
        Reassembly {
            open: None,
            max_message_len,
        }
    }

    /// The bytes still to come of the segmented message half received, if one is.
    pub(super) fn remaining(&self) -> Option<u64> {
        self.open
            .as_ref()
            .map(|(expected, received)| expected.saturating_sub(received.len() as u64))
    }

    /// Checks that a whole message of `len` bytes, in a frame of `kind` (`Whole` or
    /// `Packed`), may be delivered now.
    pub(super) fn check_whole(&self, kind: FrameKind, len: u64) -> Result<(), ReassemblyError> {
        if let Some((expected, _)) = &self.open {
            return Err(ReassemblyError::MessageStillOpen {
                kind,
                expected: *expected,
            });
        }
        self.check_len(len)
    }

    /// Takes one segment; returns the whole message when `kind` is `Last` and it completes.
    /// A `First` segment gets its buffer from `buffer_for` (asked for the message length,
    /// it returns an empty buffer with room for it).
    pub(super) fn segment(
        &mut self,
        kind: FrameKind,
        message_len: u64,
        payload: &[u8],
        buffer_for: impl FnOnce(usize) -> Vec<u8>,
    ) -> Result<Option<Vec<u8>>, ReassemblyError> {
        match kind {
            FrameKind::First => {
                if let Some((expected, _)) = &self.open {
                    return Err(ReassemblyError::MessageStillOpen {
                        kind,
                        expected: *expected,
                    });
                }
                self.check_len(message_len)?;
                let mut buffer = buffer_for(message_len as usize);
                buffer.extend_from_slice(payload);
                self.open = Some((message_len, buffer));
                Ok(None)
            }
            FrameKind::Middle | FrameKind::Last => {
                let Some((expected, buffer)) = &mut self.open else {
                    return Err(ReassemblyError::NoMessageOpen { kind });
                };
                let expected = *expected;
                let received = (buffer.len() + payload.len()) as u64;
                let complete = kind == FrameKind::Last;
                if received > expected || (complete && received != expected) {
                    self.open = None;
                    return Err(ReassemblyError::LengthMismatch { expected, received });
                }
                buffer.extend_from_slice(payload);
                if complete {
                    Ok(self.open.take().map(|(_, message)| message))
                } else {
                    Ok(None)
                }
            }
            other => Err(ReassemblyError::NoMessageOpen { kind: other }),
        }
    }

    fn check_len(&self, len: u64) -> Result<(), ReassemblyError> {
        if len > self.max_message_len {
            return Err(ReassemblyError::TooLong {
                len,
                max: self.max_message_len,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_make_one_message() {
        let mut reassembly = Reassembly::new(1 << 20);
        assert_eq!(
            reassembly.segment(FrameKind::First, 10, b"abcd", Vec::with_capacity),
            Ok(None)
        );
        assert!(
            reassembly.check_whole(FrameKind::Whole, 3).is_err(),
            "a message is open"
        );
        assert_eq!(
            reassembly.segment(FrameKind::Middle, 0, b"efg", Vec::with_capacity),
            Ok(None)
        );
        assert_eq!(
            reassembly.segment(FrameKind::Last, 0, b"hij", Vec::with_capacity),
            Ok(Some(b"abcdefghij".to_vec()))
        );
        assert_eq!(
            reassembly.check_whole(FrameKind::Whole, 3),
            Ok(()),
            "nothing left open"
        );
    }

    #[test]
    fn out_of_order_and_wrong_lengths_are_refused() {
        let mut reassembly = Reassembly::new(100);
        assert!(matches!(
            reassembly.segment(FrameKind::Last, 0, b"x", Vec::with_capacity),
            Err(ReassemblyError::NoMessageOpen { .. })
        ));
        assert!(matches!(
            reassembly.segment(FrameKind::First, 101, b"x", Vec::with_capacity),
            Err(ReassemblyError::TooLong { len: 101, max: 100 })
        ));
        assert!(reassembly.check_whole(FrameKind::Whole, 101).is_err());
        reassembly
            .segment(FrameKind::First, 5, b"ab", Vec::with_capacity)
            .unwrap();
        assert!(matches!(
            reassembly.segment(FrameKind::First, 5, b"ab", Vec::with_capacity),
            Err(ReassemblyError::MessageStillOpen { expected: 5, .. })
        ));
        assert!(matches!(
            reassembly.segment(FrameKind::Last, 0, b"c", Vec::with_capacity),
            Err(ReassemblyError::LengthMismatch {
                expected: 5,
                received: 3
            })
        ));
        assert_eq!(
            reassembly.check_whole(FrameKind::Whole, 1),
            Ok(()),
            "a broken message is dropped whole"
        );
        reassembly
            .segment(FrameKind::First, 5, b"ab", Vec::with_capacity)
            .unwrap();
        assert!(matches!(
            reassembly.segment(FrameKind::Middle, 0, b"cdef", Vec::with_capacity),
            Err(ReassemblyError::LengthMismatch {
                expected: 5,
                received: 6
            })
        ));
    }
}
