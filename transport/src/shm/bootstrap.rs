//! The bootstrap socket of a shared-memory connection: a Unix-domain `SOCK_SEQPACKET`
//! socket that carries the handshake, hands over memory files (`SCM_RIGHTS`), and tells
//! each side when the other process is gone (end of file).
//!
//! Every message is one [`Record`] of [`RECORD_LEN`] bytes, optionally with one file
//! descriptor. Records are checked whole on arrival: a wrong length, magic, version or
//! kind, or a descriptor where none belongs (or none where one does), is a
//! [`RecordError`], never a guess.
//!
//! # Invariants
//!
//! - A descriptor received with a record is owned by the [`Received`] that carries it, so
//!   one that arrives with a malformed record is closed, not leaked.
//! - A memory file is mapped only after its length and seals are checked: it must be
//!   sealed against shrinking, so the mapping stays backed for as long as it lives.
//! - A receive the kernel marked `MSG_CTRUNC` is never taken as a record: a descriptor
//!   that came with it was dropped. With no descriptor received, this process could not
//!   take it (its limit of open files, or a security module), a
//!   [`SocketError::LocalResource`]; with one received, the peer sent more than a record
//!   carries, a [`RecordError`].

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Bytes in every record.
pub(crate) const RECORD_LEN: usize = 32;

/// `"tierbufS"` with the record layout's version in the last byte.
const RECORD_MAGIC: u64 = u64::from_be_bytes(*b"tierbu\x53\x01");

const KIND_HELLO: u32 = 1;
const KIND_WELCOME: u32 = 2;
const KIND_REFUSE: u32 = 3;
const KIND_ANNOUNCE: u32 = 4;
const KIND_FORGET: u32 = 5;
const KIND_WAKE: u32 = 6;

/// How long a handshake or a blocked record send may take before it fails.
pub(crate) const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// One message on the bootstrap socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// The connecting side's opening, with the connection segment's memory file.
    Hello {
        /// The connecting side's receive depth.
        recv_depth: u32,
        /// The connecting process.
        pid: u32,
    },
    /// The accepting side's agreement.
    Welcome {
        /// The accepting side's receive depth.
        recv_depth: u32,
        /// The accepting process.
        pid: u32,
    },
    /// The accepting side's refusal, with why.
    Refuse(Refusal),
    /// A region the sender may now fill, with its memory file.
    Announce {
        /// The region's remote key.
        remote_key: u32,
        /// The address of the region's first byte (and of the file's first byte).
        remote_addr: u64,
        /// The memory file's length.
        file_len: u64,
    },
    /// A region deregistered since its announcement; the peer unmaps it.
    Forget {
        /// The region's remote key.
        remote_key: u32,
        /// The address of the region's first byte, telling key reuses apart.
        remote_addr: u64,
    },
    /// A delivery (or a close) came while the receiver was parked: it wakes it. Carries
    /// nothing; the receiver reads it and drops it.
    Wake,
}

/// Why an accepting side refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The segment's memory file was not of this layout, or not sealed.
    BadSegment,
    /// A receive depth outside what the ring holds.
    BadDepth,
    /// The accepting side's endpoints map as much of their peers' memory as its
    /// provider's total allows.
    Full,
}

impl Refusal {
    fn code(self) -> u64 {
        match self {
            Refusal::BadSegment => 1,
            Refusal::BadDepth => 2,
            Refusal::Full => 3,
        }
    }

    /// What the refusal means, for errors.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Refusal::BadSegment => {
                "the connection segment was not of this layout or not sealed \
                 (are both processes the same tierbuf version?)"
            }
            Refusal::BadDepth => "the receive depth is outside 1..=RING_CAPACITY",
            Refusal::Full => {
                "the listener's connections map as much of their peers' memory as its total \
                 allows (ShmProvider::with_peer_mapping_total)"
            }
        }
    }
}

/// A record that did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RecordError {
    #[error("a record of {0} bytes where {RECORD_LEN} were expected")]
    Length(usize),
    #[error("a record with magic {0:#018x}: the peer is not tierbuf, or another version of it")]
    Magic(u64),
    #[error("a record of unknown kind {0}")]
    Kind(u32),
    #[error("a refusal with unknown reason {0}")]
    Reason(u64),
    #[error("a {kind} record {carried}")]
    Descriptor {
        kind: &'static str,
        carried: &'static str,
    },
}

impl Record {
    /// One record of each kind (every refusal), with the values a connection sends: for
    /// the tests here and the fuzz targets' seeds.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn examples() -> [Record; 8] {
        [
            Record::Hello {
                recv_depth: 64,
                pid: 4242,
            },
            Record::Welcome {
                recv_depth: 48,
                pid: 4243,
            },
            Record::Refuse(Refusal::BadSegment),
            Record::Refuse(Refusal::BadDepth),
            Record::Refuse(Refusal::Full),
            Record::Announce {
                remote_key: 7,
                remote_addr: 0x7f00_0000_1000,
                file_len: 32768,
            },
            Record::Forget {
                remote_key: 7,
                remote_addr: 0x7f00_0000_1000,
            },
            Record::Wake,
        ]
    }

    fn name(&self) -> &'static str {
        match self {
            Record::Hello { .. } => "hello",
            Record::Welcome { .. } => "welcome",
            Record::Refuse(_) => "refuse",
            Record::Announce { .. } => "announce",
            Record::Forget { .. } => "forget",
            Record::Wake => "wake",
        }
    }

    /// Whether a record of this kind travels with a file descriptor.
    pub(crate) fn carries_descriptor(&self) -> bool {
        matches!(self, Record::Hello { .. } | Record::Announce { .. })
    }

    /// The record's bytes: magic, kind, then three fields of the kind.
    pub(crate) fn encode(&self) -> [u8; RECORD_LEN] {
        let (kind, a, b, c): (u32, u32, u64, u64) = match *self {
            Record::Hello { recv_depth, pid } => (KIND_HELLO, recv_depth, u64::from(pid), 0),
            Record::Welcome { recv_depth, pid } => (KIND_WELCOME, recv_depth, u64::from(pid), 0),
            Record::Refuse(refusal) => (KIND_REFUSE, 0, refusal.code(), 0),
            Record::Announce {
                remote_key,
                remote_addr,
                file_len,
            } => (KIND_ANNOUNCE, remote_key, remote_addr, file_len),
            Record::Forget {
                remote_key,
                remote_addr,
            } => (KIND_FORGET, remote_key, remote_addr, 0),
            Record::Wake => (KIND_WAKE, 0, 0, 0),
        };
        let mut bytes = [0; RECORD_LEN];
        bytes[0..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&kind.to_le_bytes());
        bytes[12..16].copy_from_slice(&a.to_le_bytes());
        bytes[16..24].copy_from_slice(&b.to_le_bytes());
        bytes[24..32].copy_from_slice(&c.to_le_bytes());
        bytes
    }

    /// Parses a record's bytes and checks that a descriptor came with it exactly when
    /// its kind carries one.
    pub(crate) fn decode(bytes: &[u8], with_descriptor: bool) -> Result<Record, RecordError> {
        let bytes: &[u8; RECORD_LEN] = bytes
            .try_into()
            .map_err(|_| RecordError::Length(bytes.len()))?;
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let magic = u64_at(0);
        if magic != RECORD_MAGIC {
            return Err(RecordError::Magic(magic));
        }
        let (a, b, c) = (u32_at(12), u64_at(16), u64_at(24));
        let pid = |b: u64| u32::try_from(b).unwrap_or(u32::MAX);
        let record = match u32_at(8) {
            KIND_HELLO => Record::Hello {
                recv_depth: a,
                pid: pid(b),
            },
            KIND_WELCOME => Record::Welcome {
                recv_depth: a,
                pid: pid(b),
            },
            KIND_REFUSE => Record::Refuse(match b {
                1 => Refusal::BadSegment,
                2 => Refusal::BadDepth,
                3 => Refusal::Full,
                other => return Err(RecordError::Reason(other)),
            }),
            KIND_ANNOUNCE => Record::Announce {
                remote_key: a,
                remote_addr: b,
                file_len: c,
            },
            KIND_FORGET => Record::Forget {
                remote_key: a,
                remote_addr: b,
            },
            KIND_WAKE => Record::Wake,
            other => return Err(RecordError::Kind(other)),
        };
        if record.carries_descriptor() != with_descriptor {
            return Err(RecordError::Descriptor {
                kind: record.name(),
                carried: if with_descriptor {
                    "carried a file descriptor"
                } else {
                    "did not carry a file descriptor"
                },
            });
        }
        Ok(record)
    }
}

/// A record as received, with the descriptor that came with it.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) record: Record,
    pub(crate) descriptor: Option<OwnedFd>,
}

/// What a receive on the socket found.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A well-formed record.
    Record(Received),
    /// Nothing yet (non-blocking receive only).
    Nothing,
    /// The peer's socket is closed: the peer closed it or its process ended.
    Closed,
}

/// Why a socket operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SocketError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{operation} failed")]
    Io {
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// This process could not take a descriptor the peer passed; not the peer's fault.
    #[error("{operation}")]
    LocalResource {
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(operation: &'static str) -> impl FnOnce(rustix::io::Errno) -> SocketError {
    move |errno| SocketError::Io {
        operation,
        source: errno.into(),
    }
}

/// Sends `record`, with `descriptor` when its kind carries one.
pub(crate) fn send_record(
    socket: BorrowedFd<'_>,
    record: Record,
    descriptor: Option<BorrowedFd<'_>>,
) -> Result<(), SocketError> {
    let bytes = record.encode();
    let descriptors: Vec<BorrowedFd<'_>> = descriptor.into_iter().collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !descriptors.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(&descriptors));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(io_error("sending a bootstrap record"))?;
    if sent != RECORD_LEN {
        return Err(RecordError::Length(sent).into());
    }
    Ok(())
}

/// Wakes a parked peer: sends [`Record::Wake`] without waiting. A peer whose socket is
/// full has records to read, so it is not asleep on it; one whose socket is gone is
/// noticed by the next look at the socket. Neither needs the wake, so neither is an error.
pub(crate) fn send_wake(socket: BorrowedFd<'_>) {
    let bytes = Record::Wake.encode();
    let _not_needed_when_refused =
        rustix::net::send(socket, &bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
}

/// Receives one record; with `wait` false, returns [`Incoming::Nothing`] at once when
/// none is there.
pub(crate) fn receive_record(socket: BorrowedFd<'_>, wait: bool) -> Result<Incoming, SocketError> {
    // One byte more than a record, so that a longer message shows as too long rather
    // than as a record.
    let mut bytes = [0u8; RECORD_LEN + 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = if wait {
        RecvFlags::CMSG_CLOEXEC
    } else {
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT
    };
    let received = match rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        flags,
    ) {
        Ok(received) => received,
        Err(rustix::io::Errno::AGAIN) if !wait => return Ok(Incoming::Nothing),
        Err(rustix::io::Errno::AGAIN) => {
            return Err(SocketError::Io {
                operation: "waiting for a bootstrap record",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the peer sent nothing for {SOCKET_TIMEOUT:?}"),
                ),
            });
        }
        Err(rustix::io::Errno::CONNRESET) => return Ok(Incoming::Closed),
        Err(errno) => return Err(io_error("receiving a bootstrap record")(errno)),
    };
    let mut descriptors = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            descriptors.extend(fds);
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) && descriptors.is_empty() {
        return Err(descriptor_dropped(socket));
    }
    if received.bytes == 0 && descriptors.is_empty() {
        return Ok(Incoming::Closed);
    }
    // With one received and the rest cut off, the peer passed more than one.
    if descriptors.len() > 1 || received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(RecordError::Descriptor {
            kind: "bootstrap",
            carried: "carried more than one file descriptor",
        }
        .into());
    }
    let record = Record::decode(&bytes[..received.bytes], !descriptors.is_empty())?;
    Ok(Incoming::Record(Received {
        record,
        descriptor: descriptors.pop(),
    }))
}

/// Why the kernel dropped a descriptor the peer passed (`MSG_CTRUNC` with none received):
/// the room for it was there, so this process could not take it. Taking one more now
/// tells which limit that was.
fn descriptor_dropped(socket: BorrowedFd<'_>) -> SocketError {
    match rustix::io::fcntl_dupfd_cloexec(socket, 0) {
        Err(errno) => SocketError::LocalResource {
            operation: "taking a file descriptor the peer passed: the kernel dropped it \
                        (MSG_CTRUNC) and this process can open no more files \
                        (its limit, RLIMIT_NOFILE, is reached)",
            source: errno.into(),
        },
        Ok(_probe) => SocketError::LocalResource {
            operation: "taking a file descriptor the peer passed: the kernel dropped it \
                        (MSG_CTRUNC)",
            source: std::io::Error::other(
                "this process can take one now: its limit of open files (RLIMIT_NOFILE) \
                 was reached and has been freed since, or a security module refused the file",
            ),
        },
    }
}

/// Why [`FileMapping::map`] mapped nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MapError {
    /// The file is not what its sender said it is (its length, its seals, its kind): the
    /// sender's doing.
    #[error("{0}")]
    NotAsSaid(String),
    /// The kernel refused this process: its mappings, its address space or its files
    /// ran out. Not the sender's fault.
    #[error("{operation}")]
    Refused {
        /// What was refused.
        operation: &'static str,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
}

/// A shared mapping of a peer's memory file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct FileMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the pointer is not tied to a
// thread, and what may be written through it is ruled by its users' protocol.
unsafe impl Send for FileMapping {}
// SAFETY: `&FileMapping` hands out only the pointer value and the length.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps all `len` bytes of `file` shared, after checking that the file is exactly
    /// that long and sealed against shrinking.
    pub(crate) fn map(file: impl AsFd, len: u64) -> Result<FileMapping, MapError> {
        use rustix::fs::SealFlags;
        use rustix::io::Errno;
        use rustix::mm::{MapFlags, ProtFlags};
        let file = file.as_fd();
        let stat = rustix::fs::fstat(file).map_err(|errno| MapError::Refused {
            operation: "fstat of the memory file",
            source: errno.into(),
        })?;
        if u64::try_from(stat.st_size).ok() != Some(len) || len == 0 {
            return Err(MapError::NotAsSaid(format!(
                "a memory file of {} bytes was announced as {len} bytes",
                stat.st_size
            )));
        }
        let seals = rustix::fs::fcntl_get_seals(file).map_err(|errno| {
            MapError::NotAsSaid(format!(
                "a file that takes no seals (reading them: {errno})"
            ))
        })?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(MapError::NotAsSaid(
                "a memory file that is not sealed against shrinking".to_string(),
            ));
        }
        let len = usize::try_from(len)
            .map_err(|_| MapError::NotAsSaid(format!("a memory file of {len} bytes")))?;
        // SAFETY: a fresh shared mapping at an address of the kernel's choosing aliases
        // nothing of this process; the file cannot shrink, so every page stays backed.
        let start = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                file,
                0,
            )
        }
        .map_err(|errno| match errno {
            // Out of mappings (`vm.max_map_count`), address space or files.
            Errno::NOMEM | Errno::AGAIN | Errno::NFILE | Errno::MFILE => MapError::Refused {
                operation: "mapping a memory file (this process's mappings, address \
                            space or files)",
                source: errno.into(),
            },
            // A file opened for reading only, or of a kind that cannot be mapped.
            errno => MapError::NotAsSaid(format!("a file that cannot be mapped: {errno}")),
        })?;
        let base = NonNull::new(start.cast())
            .ok_or_else(|| MapError::NotAsSaid("mmap returned a null mapping".to_string()))?;
        Ok(FileMapping { base, len })
    }

    /// The first mapped byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range `mmap` returned; whoever reached into it did so through
        // borrows of this value, which have ended. Failure leaves nothing to act on.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for record in Record::examples() {
            let bytes = record.encode();
            assert_eq!(
                Record::decode(&bytes, record.carries_descriptor()),
                Ok(record)
            );
        }
    }

    #[test]
    fn malformed_records_are_refused_by_name() {
        let hello = Record::Hello {
            recv_depth: 1,
            pid: 1,
        }
        .encode();
        assert_eq!(
            Record::decode(&hello[..31], true),
            Err(RecordError::Length(31))
        );
        assert_eq!(Record::decode(&[0; 33], true), Err(RecordError::Length(33)));
        let mut wrong_magic = hello;
        wrong_magic[7] = 2;
        assert!(matches!(
            Record::decode(&wrong_magic, true),
            Err(RecordError::Magic(_))
        ));
        let mut wrong_kind = hello;
        wrong_kind[8] = 99;
        assert_eq!(
            Record::decode(&wrong_kind, true),
            Err(RecordError::Kind(99))
        );
        let mut wrong_reason = Record::Refuse(Refusal::BadDepth).encode();
        wrong_reason[16] = 9;
        assert_eq!(
            Record::decode(&wrong_reason, false),
            Err(RecordError::Reason(9))
        );
        assert!(matches!(
            Record::decode(&hello, false),
            Err(RecordError::Descriptor { kind: "hello", .. })
        ));
        let forget = Record::Forget {
            remote_key: 1,
            remote_addr: 2,
        }
        .encode();
        assert!(matches!(
            Record::decode(&forget, true),
            Err(RecordError::Descriptor { kind: "forget", .. })
        ));
    }

    fn socket_pair() -> (OwnedFd, OwnedFd) {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn records_and_descriptors_cross_a_socket() {
        let (a, b) = socket_pair();
        let file = rustix::fs::memfd_create(
            "test",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .unwrap();
        rustix::fs::ftruncate(&file, 4096).unwrap();
        let announce = Record::Announce {
            remote_key: 5,
            remote_addr: 0x1000,
            file_len: 4096,
        };
        send_record(a.as_fd(), announce, Some(file.as_fd())).unwrap();
        let Incoming::Record(received) = receive_record(b.as_fd(), false).unwrap() else {
            panic!("no record");
        };
        assert_eq!(received.record, announce);
        let descriptor = received.descriptor.unwrap();
        assert_eq!(rustix::fs::fstat(&descriptor).unwrap().st_size, 4096);
        // Unsealed: refused before mapping.
        assert!(
            FileMapping::map(&descriptor, 4096)
                .unwrap_err()
                .to_string()
                .contains("sealed")
        );
        rustix::fs::fcntl_add_seals(&file, rustix::fs::SealFlags::SHRINK).unwrap();
        assert!(
            FileMapping::map(&descriptor, 8192)
                .unwrap_err()
                .to_string()
                .contains("4096")
        );
        let mapping = FileMapping::map(&descriptor, 4096).unwrap();
        assert_eq!(mapping.len(), 4096);
        assert!(matches!(
            receive_record(b.as_fd(), false).unwrap(),
            Incoming::Nothing
        ));
        drop(a);
        assert!(matches!(
            receive_record(b.as_fd(), false).unwrap(),
            Incoming::Closed
        ));
    }

    /// More descriptors than the receive has room for: the kernel cuts them off
    /// (`MSG_CTRUNC`), but some arrived, so this process could take them and the peer
    /// broke the protocol.
    #[test]
    fn descriptors_cut_off_after_some_arrived_are_the_peers_fault() {
        let (a, b) = socket_pair();
        let descriptors = [a.as_fd(), a.as_fd(), a.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&descriptors)));
        let announce = Record::Announce {
            remote_key: 5,
            remote_addr: 0x1000,
            file_len: 4096,
        }
        .encode();
        rustix::net::sendmsg(
            &a,
            &[IoSlice::new(&announce)],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        let error = receive_record(b.as_fd(), false).expect_err("more than one descriptor");
        assert!(
            matches!(error, SocketError::Record(RecordError::Descriptor { .. })),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "a bootstrap record carried more than one file descriptor"
        );
    }

    #[test]
    fn a_malformed_message_on_the_socket_is_an_error_and_its_descriptor_is_closed() {
        let (a, b) = socket_pair();
        rustix::net::send(&a, b"not a record", SendFlags::empty()).unwrap();
        assert!(matches!(
            receive_record(b.as_fd(), false),
            Err(SocketError::Record(RecordError::Length(12)))
        ));
    }
}
