//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`): thin wrappers that
//! make crate-private parsers callable from outside the crate, and nothing more. This is
//! not an API: nothing but the fuzz targets enables the feature.
//!
//! - [`decode_frame_header`] and [`encode_frame_header`]: the 16-byte header every
//!   connection frame starts with (`connection/header.rs`).
//! - [`ShmRecord`]: the records of the shared-memory provider's bootstrap socket
//!   (`shm/bootstrap.rs`).

#![doc(hidden)]

use std::fmt;

use crate::connection::header::{FrameHeader, Grant};
use crate::connection::{FrameKind, HEADER_LEN, HeaderError};
use crate::shm::{RECORD_LEN, Record, RecordError};

/// The fields of a connection frame header (`docs/connection.md`, "Frame header").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeaderFields {
    /// What the frame carries.
    pub kind: FrameKind,
    /// The tier of the receives the frame grants.
    pub grant_tier: u8,
    /// How many receives it grants.
    pub grant_count: u16,
    /// Bytes of payload after the header.
    pub payload_len: u32,
    /// The whole message's length (`Whole` and `First` frames; 0 otherwise).
    pub message_len: u64,
}

impl From<FrameHeader> for FrameHeaderFields {
    fn from(header: FrameHeader) -> FrameHeaderFields {
        FrameHeaderFields {
            kind: header.kind,
            grant_tier: header.grant.tier,
            grant_count: header.grant.count,
            payload_len: header.payload_len,
            message_len: header.message_len,
        }
    }
}

impl From<FrameHeaderFields> for FrameHeader {
    fn from(fields: FrameHeaderFields) -> FrameHeader {
        FrameHeader {
            kind: fields.kind,
            grant: Grant {
                tier: fields.grant_tier,
                count: fields.grant_count,
            },
            payload_len: fields.payload_len,
            message_len: fields.message_len,
        }
    }
}

/// Reads and validates the header at the start of `frame` (the bytes one receive
/// completion reported), as a connection does with every frame it receives.
///
/// # Errors
///
/// The [`HeaderError`] the connection would fail with.
pub fn decode_frame_header(frame: &[u8]) -> Result<FrameHeaderFields, HeaderError> {
    FrameHeader::decode(frame).map(FrameHeaderFields::from)
}

/// The bytes a connection writes for `header` at the start of a frame.
pub fn encode_frame_header(header: &FrameHeaderFields) -> [u8; HEADER_LEN] {
    let mut bytes = [0; HEADER_LEN];
    FrameHeader::from(*header).encode(&mut bytes);
    bytes
}

/// Bytes in every shm bootstrap record.
pub const SHM_RECORD_LEN: usize = RECORD_LEN;

/// A record of the shm provider's bootstrap socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmRecord(Record);

impl ShmRecord {
    /// Parses a record as the provider does on arrival; `with_descriptor` says whether a
    /// file descriptor came with it.
    ///
    /// # Errors
    ///
    /// Why the provider would refuse the record.
    pub fn decode(bytes: &[u8], with_descriptor: bool) -> Result<ShmRecord, ShmRecordError> {
        Record::decode(bytes, with_descriptor)
            .map(ShmRecord)
            .map_err(ShmRecordError)
    }

    /// The record's bytes, as the provider sends them.
    pub fn encode(&self) -> [u8; SHM_RECORD_LEN] {
        self.0.encode()
    }

    /// Whether a record of this kind travels with a file descriptor.
    pub fn carries_descriptor(&self) -> bool {
        self.0.carries_descriptor()
    }

    /// One record of each kind (every refusal), with the values a connection sends: the
    /// fuzz targets' seeds.
    pub fn examples() -> [ShmRecord; 8] {
        Record::examples().map(ShmRecord)
    }
}

/// Why a bootstrap record did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRecordError(RecordError);

impl fmt::Display for ShmRecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ShmRecordError {}
