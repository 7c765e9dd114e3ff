//! Reading a fuzz input as a sequence of little-endian fields.

/// Takes fields off the front of a fuzz input; past its end every read is `None`, so a
/// harness stops where the input does.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// The next `N` bytes.
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    /// The next byte.
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array().map(|[byte]| byte)
    }

    /// The next two bytes, little-endian.
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    /// The next four bytes, little-endian.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    /// The next eight bytes, little-endian.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// The next `len` bytes, or all that are left if fewer.
    pub(crate) fn bytes(&mut self, len: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(len.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    /// A byte string written as its `u16` length and its bytes ([`put_bytes`]).
    pub(crate) fn byte_string(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()?;
        Some(self.bytes(usize::from(len)))
    }
}

/// The first `N` bytes of `bytes`, padded with zeroes past its end: a short input read
/// as fixed fields.
pub(crate) fn padded<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut padded = [0u8; N];
    let len = bytes.len().min(N);
    padded[..len].copy_from_slice(&bytes[..len]);
    padded
}

/// Writes `bytes` as [`Reader::byte_string`] reads them.
///
/// # Panics
///
/// If `bytes` is longer than a `u16` counts.
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).expect("a byte string of the seeds fits a u16 length");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}
