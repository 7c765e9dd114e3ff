//! Packed frames: several small whole messages in one frame (`docs/connection.md`,
//! "Frame header", and rule 12), so a receiver takes a batch for the price of one receive.
//!
//! # Invariants
//!
//! - An entry is a [`PACKED_ENTRY_HEAD`]-byte head (the message's length, `u32` little
//!   endian, then four zero bytes) and the message's bytes, padded with zeros to a multiple
//!   of eight. Every message of a packed frame therefore starts 8-byte aligned in its
//!   receive slot.
//! - [`read_entries`] accepts a payload only if it is exactly the header's count of entries,
//!   each within the payload, with zero reserved bytes; otherwise it reports the first
//!   offending entry as a [`PackedError`], delivers nothing and never panics. Padding
//!   bytes are not read.
//! - [`pack`] never plans past `room`, and only messages that `packs` admits, in order:
//!   the frame the sender writes with [`write_entries`] is what [`read_entries`] accepts.

use std::ops::Range;

use super::header::PACKED_ENTRY_HEAD;

/// Why a packed frame's entries were refused: the peer's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackedError {
    /// An entry's head or message runs past the frame's payload.
    #[error("entry {index} of {len} bytes runs past the {available} payload bytes left")]
    EntryPastFrame {
        /// The entry's place in the frame, from 0.
        index: usize,
        /// The message length its head gives (0 when the head itself does not fit).
        len: u64,
        /// Payload bytes left at the entry's start.
        available: usize,
    },
    /// An entry's reserved bytes are not zero.
    #[error("entry {index} has reserved bytes {reserved:#x}, not zero")]
    ReservedNotZero {
        /// The entry's place in the frame, from 0.
        index: usize,
        /// The reserved bytes, as a little-endian `u32`.
        reserved: u32,
    },
    /// Bytes follow the header's count of entries.
    #[error("{trailing} bytes follow the frame's {count} entries")]
    TrailingBytes {
        /// The entries the header counts.
        count: u64,
        /// Payload bytes after them.
        trailing: usize,
    },
}

/// Bytes an entry of a `len`-byte message takes: its head and its bytes, padded to 8.
pub(super) const fn entry_len(len: usize) -> usize {
    PACKED_ENTRY_HEAD + len.next_multiple_of(8)
}

/// How many of `messages`, from the first, go into one packed frame of at most `room`
/// payload bytes, taking only messages `packs` admits; and the payload bytes they take.
pub(super) fn pack(
    messages: &[&[u8]],
    room: usize,
    packs: impl Fn(usize) -> bool,
) -> (usize, usize) {
    let mut bytes = 0;
    let mut count = 0;
    for message in messages {
        let len = entry_len(message.len());
        if !packs(message.len()) || bytes + len > room {
            break;
        }
        bytes += len;
        count += 1;
    }
    (count, bytes)
}

/// The payload bytes of the leading run of `messages` that `packs` admits, were they all
/// in one packed frame.
pub(super) fn run_len(messages: &[&[u8]], packs: impl Fn(usize) -> bool) -> usize {
    messages
        .iter()
        .take_while(|message| packs(message.len()))
        .map(|message| entry_len(message.len()))
        .sum()
}

/// Writes `messages` as entries into `out`, which is exactly as long as they take.
///
/// # Panics
///
/// If `out` is not as long as the entries of `messages`, or a message is 4 GiB or more.
pub(super) fn write_entries(out: &mut [u8], messages: &[&[u8]]) {
    let mut at = 0;
    for message in messages {
        let len = u32::try_from(message.len()).expect("a packed message is under 4 GiB");
        // The length and the four zero bytes after it, in one store.
        out[at..at + PACKED_ENTRY_HEAD].copy_from_slice(&u64::from(len).to_le_bytes());
        let start = at + PACKED_ENTRY_HEAD;
        out[start..start + message.len()].copy_from_slice(message);
        let end = at + entry_len(message.len());
        for pad in &mut out[start + message.len()..end] {
            *pad = 0;
        }
        at = end;
    }
    assert_eq!(at, out.len(), "the frame is as long as its entries");
}

/// Reads the `count` entries of a packed frame's `payload` in order, handing each
/// message's byte range within `payload` to `take` once its entry is checked (module
/// invariants). Each range is computed once, from the bytes as they were read: a peer
/// that writes into the frame later changes what a message holds, never where it lies.
///
/// # Errors
///
/// The first entry that breaks the format, or bytes after the last; `take` has then been
/// handed the entries before it, which the caller discards.
pub(super) fn read_entries(
    payload: &[u8],
    count: u64,
    mut take: impl FnMut(Range<usize>),
) -> Result<(), PackedError> {
    let mut at = 0;
    for index in 0..count as usize {
        let available = payload.len() - at;
        let Some(&[l0, l1, l2, l3, r0, r1, r2, r3]) =
            payload[at..].first_chunk::<PACKED_ENTRY_HEAD>()
        else {
            return Err(PackedError::EntryPastFrame {
                index,
                len: 0,
                available,
            });
        };
        let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        let reserved = u32::from_le_bytes([r0, r1, r2, r3]);
        if reserved != 0 {
            return Err(PackedError::ReservedNotZero { index, reserved });
        }
        // Checked against what is left, so `entry_len` cannot overflow.
        if len > available - PACKED_ENTRY_HEAD || entry_len(len) > available {
            return Err(PackedError::EntryPastFrame {
                index,
                len: len as u64,
                available,
            });
        }
        let start = at + PACKED_ENTRY_HEAD;
        take(start..start + len);
        at += entry_len(len);
    }
    if at != payload.len() {
        return Err(PackedError::TrailingBytes {
            count,
            trailing: payload.len() - at,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entries(payload: &[u8], count: u64) -> Result<Vec<Range<usize>>, PackedError> {
        let mut ranges = Vec::new();
        read_entries(payload, count, |range| ranges.push(range))?;
        Ok(ranges)
    }

    fn packed(messages: &[&[u8]]) -> Vec<u8> {
        let len = messages
            .iter()
            .map(|message| entry_len(message.len()))
            .sum();
        let mut out = vec![0xa5; len];
        write_entries(&mut out, messages);
        out
    }

    #[test]
    fn pack_stops_at_the_room_and_at_a_message_it_may_not_take() {
        let messages: [&[u8]; 4] = [&[1; 64], &[2; 1], &[3; 200], &[4; 8]];
        assert_eq!(pack(&messages, 1000, |_| true), (4, 72 + 16 + 208 + 16));
        assert_eq!(pack(&messages, 72 + 16 + 207, |_| true), (2, 88));
        assert_eq!(pack(&messages, 1000, |len| len < 100), (2, 88));
        assert_eq!(pack(&messages, 71, |_| true), (0, 0));
    }

    #[test]
    fn a_run_ends_at_the_first_message_that_does_not_pack() {
        let messages: [&[u8]; 4] = [&[1; 64], &[2; 1], &[3; 900], &[4; 8]];
        assert_eq!(run_len(&messages, |len| len < 500), 72 + 16);
        assert_eq!(run_len(&messages, |_| true), 72 + 16 + 912 + 16);
        assert_eq!(run_len(&messages, |_| false), 0);
    }

    #[test]
    fn written_entries_read_back_aligned_and_padded_with_zeros() {
        let messages: [&[u8]; 3] = [b"hello", b"", &[9; 16]];
        let frame = packed(&messages);
        assert_eq!(frame.len(), 16 + 8 + 24);
        assert_eq!(&frame[13..16], &[0, 0, 0], "padding is zeroed");
        let ranges = entries(&frame, 3).expect("well formed");
        assert_eq!(ranges.len(), 3);
        for (range, message) in ranges.iter().zip(messages) {
            assert_eq!(range.start % 8, 0);
            assert_eq!(&frame[range.clone()], message);
        }
    }

    #[test]
    fn malformed_entries_are_refused() {
        let frame = packed(&[b"abc", b"defgh"]);
        assert_eq!(
            entries(&frame, 3).err(),
            Some(PackedError::EntryPastFrame {
                index: 2,
                len: 0,
                available: 0
            })
        );
        assert_eq!(
            entries(&frame, 1).err(),
            Some(PackedError::TrailingBytes {
                count: 1,
                trailing: 16
            })
        );
        let mut reserved = frame.clone();
        reserved[20] = 1;
        assert_eq!(
            entries(&reserved, 2).err(),
            Some(PackedError::ReservedNotZero {
                index: 1,
                reserved: 1
            })
        );
        let mut long = frame.clone();
        long[16..20].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            entries(&long, 2).err(),
            Some(PackedError::EntryPastFrame {
                index: 1,
                len: 9,
                available: 16
            })
        );
        let mut huge = frame;
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            entries(&huge, 2).err(),
            Some(PackedError::EntryPastFrame { index: 0, .. })
        ));
    }

    proptest! {
        #[test]
        fn what_is_written_is_read(
            messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..12)
        ) {
            let slices: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
            let frame = packed(&slices);
            let ranges = entries(&frame, slices.len() as u64).expect("well formed");
            prop_assert_eq!(ranges.len(), slices.len());
            for (range, message) in ranges.into_iter().zip(slices) {
                prop_assert_eq!(&frame[range], message);
            }
        }

        #[test]
        fn random_payloads_never_panic(
            payload in prop::collection::vec(any::<u8>(), 0..96),
            count in 0u64..16,
        ) {
            if let Ok(ranges) = entries(&payload, count) {
                prop_assert_eq!(ranges.len() as u64, count);
                for range in ranges {
                    prop_assert!(range.end <= payload.len());
                }
            }
        }
    }
}
