//! The messages the transport benches send and how their receivers check them: a
//! sequence number in the first word, a fixed pattern after it, read either in four
//! places or whole.

/// A message of `size` bytes (at least 8): a sequence number in the first 8 bytes, a
/// pattern after it.
///
/// ```
/// let message = tierbuf_benches::messages::message(64);
/// assert_eq!((message.len(), message[63]), (64, (63 * 7 + 3) as u8));
/// ```
pub fn message(size: usize) -> Vec<u8> {
    assert!(size >= 8, "room for the sequence number");
    (0..size).map(|i| (i * 7 + 3) as u8).collect()
}

/// Writes sequence number `seq` into `message`.
///
/// ```
/// use tierbuf_benches::messages::{message, stamp};
/// let mut message = message(16);
/// stamp(&mut message, 9);
/// assert_eq!(message[..8], 9u64.to_le_bytes());
/// ```
pub fn stamp(message: &mut [u8], seq: u64) {
    message[..8].copy_from_slice(&seq.to_le_bytes());
}

/// Checks that `received` is message number `seq` built like `expected`: its length, its
/// sequence number, its middle and last bytes; panics where it differs.
///
/// ```
/// use tierbuf_benches::messages::{check, message, stamp};
/// let expected = message(32);
/// let mut received = expected.clone();
/// stamp(&mut received, 5);
/// check(&received, 5, &expected);
/// ```
pub fn check(received: &[u8], seq: u64, expected: &[u8]) {
    assert_eq!(received.len(), expected.len(), "length of message {seq}");
    let got = u64::from_le_bytes(received[..8].try_into().expect("8 bytes"));
    assert_eq!(got, seq, "sequence number");
    let (middle, last) = (expected.len() / 2, expected.len() - 1);
    assert_eq!(
        (received[middle], received[last]),
        (expected[middle], expected[last]),
        "middle and last bytes of message {seq}"
    );
}

/// How the receiving side reads each message it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Its length, sequence number, middle and last bytes ([`check`]): the bytes stay where the
    /// provider delivered them, in a registered receive slot, and most of their cache
    /// lines may never reach the receiving core.
    Spot,
    /// Every byte, summed as words and compared with the sender's sum: the receiving core
    /// reads the whole message, as an MPI receive ends with the bytes in its buffer.
    Whole,
}

impl Reading {
    /// Checks `received` as message number `seq` built like `expected`, whose words after
    /// the sequence number sum to `rest` ([`rest_sum`]); panics where it differs.
    ///
    /// ```
    /// use tierbuf_benches::messages::{Reading, message, rest_sum, stamp};
    /// let expected = message(64);
    /// let mut received = expected.clone();
    /// stamp(&mut received, 3);
    /// Reading::Spot.check(&received, 3, &expected, rest_sum(&expected));
    /// Reading::Whole.check(&received, 3, &expected, rest_sum(&expected));
    /// ```
    pub fn check(self, received: &[u8], seq: u64, expected: &[u8], rest: u64) {
        match self {
            Reading::Spot => check(received, seq, expected),
            Reading::Whole => {
                assert_eq!(received.len(), expected.len(), "length of message {seq}");
                assert_eq!(
                    word_sum(received),
                    seq.wrapping_add(rest),
                    "sum of message {seq}"
                );
            }
        }
    }
}

/// The wrapping sum of `bytes` read as little-endian 64-bit words, the last one padded
/// with zeros.
///
/// ```
/// assert_eq!(tierbuf_benches::messages::word_sum(&[1, 0, 0, 0, 0, 0, 0, 0, 2]), 3);
/// ```
pub fn word_sum(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    words
        .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
        .fold(u64::from_le_bytes(last), u64::wrapping_add)
}

/// The sum [`Reading::Whole`] expects of a message built like `expected`, less its
/// sequence number (its first word).
///
/// ```
/// use tierbuf_benches::messages::{message, rest_sum, word_sum};
/// assert_eq!(rest_sum(&message(64)), word_sum(&message(64)[8..]));
/// ```
pub fn rest_sum(expected: &[u8]) -> u64 {
    word_sum(&expected[8..])
}
