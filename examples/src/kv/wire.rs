//! The key-value protocol's wire format: one request or one reply per tierbuf message.
//!
//! Every integer is little-endian. A request is an 8-byte header, the key, then the value:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | version, [`VERSION`] |
//! | 1 | operation: 1 PUT, 2 GET, 3 DELETE, 4 STATS |
//! | 2..4 | key length, at most [`MAX_KEY_LEN`] |
//! | 4..8 | value length, at most [`MAX_VALUE_LEN`]; 0 unless PUT |
//!
//! A reply is a 6-byte header and its body:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | version, [`VERSION`] |
//! | 1 | status: 0 OK, 1 NOT FOUND, 2 BAD REQUEST, 3 STORE FAILED |
//! | 2..6 | body length |
//!
//! The body of an OK reply is the value for GET, the server's samples of registered memory
//! for STATS ([`encode_samples`]) and empty for PUT and DELETE; that of BAD REQUEST and
//! STORE FAILED is a UTF-8 message. Both declared lengths must add up to the message's
//! length exactly; anything else is a [`WireError`], which the server answers with BAD
//! REQUEST.

use super::memory::Sample;

/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// The longest key.
pub const MAX_KEY_LEN: usize = 1024;
/// The largest value.
pub const MAX_VALUE_LEN: usize = 4 << 20;
/// Length of a request's header.
pub const REQUEST_HEADER_LEN: usize = 8;
/// Length of a reply's header.
pub const REPLY_HEADER_LEN: usize = 6;

const PUT: u8 = 1;
const GET: u8 = 2;
const DELETE: u8 = 3;
const STATS: u8 = 4;

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// Store `value` under `key`, replacing what was there.
    Put {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
    },
    /// The value under `key`.
    Get {
        /// The key.
        key: &'a [u8],
    },
    /// Remove `key`.
    Delete {
        /// The key.
        key: &'a [u8],
    },
    /// The server's samples of its registered memory so far.
    Stats,
}

/// A malformed request or reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than its header.
    #[error("{len} bytes is shorter than the {header}-byte header")]
    Truncated {
        /// The message's length.
        len: usize,
        /// The header's length.
        header: usize,
    },
    /// Another version of the protocol.
    #[error("protocol version {found}; this side speaks {VERSION}")]
    Version {
        /// The version in the message.
        found: u8,
    },
    /// An operation this version does not define.
    #[error("unknown operation {0}")]
    Operation(u8),
    /// A status this version does not define.
    #[error("unknown status {0}")]
    Status(u8),
    /// A key longer than [`MAX_KEY_LEN`].
    #[error("a {0}-byte key; the longest is {MAX_KEY_LEN}")]
    KeyTooLong(usize),
    /// A value larger than [`MAX_VALUE_LEN`].
    #[error("a {0}-byte value; the largest is {MAX_VALUE_LEN}")]
    ValueTooLarge(usize),
    /// A value on an operation that takes none, or a key on STATS.
    #[error("operation {operation} takes no {what}")]
    Unexpected {
        /// The operation.
        operation: u8,
        /// "value" or "key".
        what: &'static str,
    },
    /// Declared lengths that do not add up to the message's.
    #[error("the header declares {declared} bytes; the message has {actual}")]
    Length {
        /// What the header declares, header included.
        declared: usize,
        /// The message's length.
        actual: usize,
    },
    /// A STATS body that is not whole samples.
    #[error("a {0}-byte STATS body is not whole 16-byte samples")]
    Samples(usize),
}

impl<'a> Request<'a> {
    /// Reads a request, checking every length against the message's.
    ///
    /// # Errors
    ///
    /// The first thing wrong with it, as a [`WireError`].
    pub fn decode(message: &'a [u8]) -> Result<Request<'a>, WireError> {
        let header = header::<REQUEST_HEADER_LEN>(message)?;
        let operation = header[1];
        let key_len = usize::from(u16::from_le_bytes([header[2], header[3]]));
        let value_len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if !(PUT..=STATS).contains(&operation) {
            return Err(WireError::Operation(operation));
        }
        if key_len > MAX_KEY_LEN {
            return Err(WireError::KeyTooLong(key_len));
        }
        if value_len > MAX_VALUE_LEN {
            return Err(WireError::ValueTooLarge(value_len));
        }
        if value_len != 0 && operation != PUT {
            return Err(WireError::Unexpected {
                operation,
                what: "value",
            });
        }
        if key_len != 0 && operation == STATS {
            return Err(WireError::Unexpected {
                operation,
                what: "key",
            });
        }
        let declared = REQUEST_HEADER_LEN + key_len + value_len;
        if declared != message.len() {
            return Err(WireError::Length {
                declared,
                actual: message.len(),
            });
        }
        let (key, value) = message[REQUEST_HEADER_LEN..].split_at(key_len);
        Ok(match operation {
            PUT => Request::Put { key, value },
            GET => Request::Get { key },
            DELETE => Request::Delete { key },
            _ => Request::Stats,
        })
    }

    /// Writes the request into `out`, replacing what it held.
    ///
    /// # Panics
    ///
    /// If the key or value is longer than the protocol allows.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (operation, key, value): (u8, &[u8], &[u8]) = match *self {
            Request::Put { key, value } => (PUT, key, value),
            Request::Get { key } => (GET, key, &[]),
            Request::Delete { key } => (DELETE, key, &[]),
            Request::Stats => (STATS, &[], &[]),
        };
        assert!(key.len() <= MAX_KEY_LEN, "a {}-byte key", key.len());
        assert!(value.len() <= MAX_VALUE_LEN, "a {}-byte value", value.len());
        out.clear();
        out.reserve(REQUEST_HEADER_LEN + key.len() + value.len());
        out.extend_from_slice(&[VERSION, operation]);
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(value);
    }
}

/// A reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Done; the body is the answer.
    Ok,
    /// No such key.
    NotFound,
    /// The request was malformed; the body says how.
    BadRequest,
    /// The store failed; the body says how.
    StoreFailed,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::NotFound => 1,
            Status::BadRequest => 2,
            Status::StoreFailed => 3,
        }
    }
}

/// A reply: its status and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'a> {
    /// The status.
    pub status: Status,
    /// The body.
    pub body: &'a [u8],
}

impl<'a> Reply<'a> {
    /// Reads a reply, checking its length against the message's.
    ///
    /// # Errors
    ///
    /// The first thing wrong with it, as a [`WireError`].
    pub fn decode(message: &'a [u8]) -> Result<Reply<'a>, WireError> {
        let header = header::<REPLY_HEADER_LEN>(message)?;
        let status = match header[1] {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::BadRequest,
            3 => Status::StoreFailed,
            other => return Err(WireError::Status(other)),
        };
        let len = u32::from_le_bytes([header[2], header[3], header[4], header[5]]) as usize;
        let declared = REPLY_HEADER_LEN + len;
        if declared != message.len() {
            return Err(WireError::Length {
                declared,
                actual: message.len(),
            });
        }
        Ok(Reply {
            status,
            body: &message[REPLY_HEADER_LEN..],
        })
    }

    /// The reply's header, to send before its body.
    pub fn header(&self) -> [u8; REPLY_HEADER_LEN] {
        let len = (self.body.len() as u32).to_le_bytes();
        [VERSION, self.status.code(), len[0], len[1], len[2], len[3]]
    }
}

/// The `N`-byte header at the start of `message`, its version checked.
fn header<const N: usize>(message: &[u8]) -> Result<&[u8; N], WireError> {
    let Some(header) = message.first_chunk::<N>() else {
        return Err(WireError::Truncated {
            len: message.len(),
            header: N,
        });
    };
    if header[0] != VERSION {
        return Err(WireError::Version { found: header[0] });
    }
    Ok(header)
}

/// The body of a STATS reply: each sample as its time (microseconds since the Unix epoch)
/// and its registered bytes, two `u64`s.
pub fn encode_samples(samples: &[Sample]) -> Vec<u8> {
    let mut body = Vec::with_capacity(samples.len() * 16);
    for sample in samples {
        body.extend_from_slice(&sample.at_micros.to_le_bytes());
        body.extend_from_slice(&sample.bytes.to_le_bytes());
    }
    body
}

/// Reads the body of a STATS reply.
///
/// # Errors
///
/// [`WireError::Samples`] unless it is whole samples.
pub fn decode_samples(body: &[u8]) -> Result<Vec<Sample>, WireError> {
    let (samples, []) = body.as_chunks::<16>() else {
        return Err(WireError::Samples(body.len()));
    };
    Ok(samples
        .iter()
        .map(|sample| {
            let (at, bytes) = sample.split_at(8);
            Sample {
                at_micros: u64::from_le_bytes(at.try_into().expect("8 bytes")),
                bytes: u64::from_le_bytes(bytes.try_into().expect("8 bytes")),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(request: Request<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        request.encode(&mut out);
        out
    }

    #[test]
    fn every_request_reads_back_as_written() {
        let value = vec![7u8; 70_000];
        for request in [
            Request::Put {
                key: b"k",
                value: &value,
            },
            Request::Put {
                key: b"",
                value: b"",
            },
            Request::Get { key: b"key" },
            Request::Delete { key: b"key" },
            Request::Stats,
        ] {
            assert_eq!(Request::decode(&encoded(request)), Ok(request));
        }
    }

    #[test]
    fn malformed_requests_are_each_their_own_error() {
        let put = encoded(Request::Put {
            key: b"key",
            value: b"value",
        });
        assert_eq!(
            Request::decode(&put[..5]),
            Err(WireError::Truncated { len: 5, header: 8 })
        );
        assert_eq!(
            Request::decode(&put[..put.len() - 1]),
            Err(WireError::Length {
                declared: put.len(),
                actual: put.len() - 1
            })
        );
        let mut longer = put.clone();
        longer.push(0);
        assert!(matches!(
            Request::decode(&longer),
            Err(WireError::Length { .. })
        ));
        let mut version = put.clone();
        version[0] = 2;
        assert_eq!(
            Request::decode(&version),
            Err(WireError::Version { found: 2 })
        );
        let mut operation = put.clone();
        operation[1] = 9;
        assert_eq!(Request::decode(&operation), Err(WireError::Operation(9)));
        let mut get = put.clone();
        get[1] = GET;
        assert_eq!(
            Request::decode(&get),
            Err(WireError::Unexpected {
                operation: GET,
                what: "value"
            })
        );
        let mut key = encoded(Request::Get { key: b"" });
        key[2..4].copy_from_slice(&(MAX_KEY_LEN as u16 + 1).to_le_bytes());
        assert_eq!(
            Request::decode(&key),
            Err(WireError::KeyTooLong(MAX_KEY_LEN + 1))
        );
        let mut value = put;
        value[4..8].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert_eq!(
            Request::decode(&value),
            Err(WireError::ValueTooLarge(u32::MAX as usize))
        );
    }

    #[test]
    fn replies_read_back_and_their_lengths_are_checked() {
        let reply = Reply {
            status: Status::NotFound,
            body: b"",
        };
        let mut message = reply.header().to_vec();
        assert_eq!(Reply::decode(&message), Ok(reply));
        message.push(1);
        assert!(matches!(
            Reply::decode(&message),
            Err(WireError::Length { .. })
        ));
        message[1] = 7;
        assert_eq!(Reply::decode(&message), Err(WireError::Status(7)));
    }

    #[test]
    fn samples_read_back_and_a_partial_one_is_refused() {
        let samples = [
            Sample {
                at_micros: 1,
                bytes: 2,
            },
            Sample {
                at_micros: u64::MAX,
                bytes: 4 << 20,
            },
        ];
        let body = encode_samples(&samples);
        assert_eq!(decode_samples(&body).unwrap(), samples);
        assert_eq!(decode_samples(&body[..20]), Err(WireError::Samples(20)));
    }
}
