//! The connection handshake's messages and their frames: what two verbs endpoints tell
//! each other before their queue pairs can talk. Free of any device.
//!
//! A frame is an 8-byte header and a payload:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | [`MAGIC`], `b"TBVB"` |
//! | 4..6 | [`VERSION`], big-endian |
//! | 6..8 | payload length, big-endian, at most [`MAX_PAYLOAD_LEN`] |
//! | 8.. | the [`HandshakeMessage`], `postcard`-encoded |
//!
//! Each side sends a [`HandshakeMessage::Hello`] (its queue pair's address and the tier it
//! starts on), reads the peer's, connects its queue pair, and then both exchange
//! [`HandshakeMessage::Ready`], so that neither sends before the other's queue pair is
//! ready to receive. Everything read is checked before use: a wrong magic, another
//! version, an overlong or malformed payload, trailing bytes, an unexpected message and a
//! peer that closes mid-frame are each reported by their own [`HandshakeError`].

use std::io::{self, Read, Write};
use std::net::Ipv6Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tierbuf_tiers::TierIndex;

/// The first four bytes of every handshake frame.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeMessage, MAGIC, encode_frame};
/// assert!(encode_frame(&HandshakeMessage::Ready).starts_with(&MAGIC));
/// ```
pub const MAGIC: [u8; 4] = *b"TBVB";

/// The handshake version this build speaks; a peer speaking another is refused.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeMessage, VERSION, encode_frame};
/// assert_eq!(encode_frame(&HandshakeMessage::Ready)[4..6], VERSION.to_be_bytes());
/// ```
pub const VERSION: u16 = 1;

/// The longest payload a frame may carry. A hello takes under 40 bytes.
///
/// ```
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{HEADER_LEN, HandshakeMessage, Hello, MAX_PAYLOAD_LEN, QueuePairAddress, encode_frame};
/// let largest = Hello {
///     queue_pair: QueuePairAddress { num: u32::MAX, lid: u16::MAX, gid: Some(std::net::Ipv6Addr::LOCALHOST) },
///     initial_tier: TierIndex::new(u8::MAX),
/// };
/// assert!(encode_frame(&HandshakeMessage::Hello(largest)).len() - HEADER_LEN < usize::from(MAX_PAYLOAD_LEN));
/// ```
pub const MAX_PAYLOAD_LEN: u16 = 256;

/// The length of a frame header: magic, version and payload length.
///
/// ```
/// use tierbuf_transport::verbs::handshake::HEADER_LEN;
/// assert_eq!(HEADER_LEN, 4 + 2 + 2);
/// ```
pub const HEADER_LEN: usize = 8;

/// Where a queue pair is reached: what connecting a queue pair to it needs.
///
/// Encoded as the fields in order (postcard: the number and LID as varints, the GID as
/// an option of sixteen bytes).
///
/// ```
/// use std::net::Ipv6Addr;
/// use tierbuf_transport::verbs::handshake::QueuePairAddress;
/// let roce = QueuePairAddress { num: 17, lid: 0, gid: Some("::ffff:10.0.2.15".parse::<Ipv6Addr>()?) };
/// assert_eq!(roce.gid.and_then(|gid| gid.to_ipv4_mapped()), Some([10, 0, 2, 15].into()));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePairAddress {
    /// The queue pair number.
    pub num: u32,
    /// The port's local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID the queue pair routes by (RoCE, or InfiniBand across subnets), as the
    /// IPv6 address it is.
    pub gid: Option<Ipv6Addr>,
}

/// What one side tells the other about itself.
///
/// ```
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{Hello, QueuePairAddress};
/// let hello = Hello {
///     queue_pair: QueuePairAddress { num: 17, lid: 3, gid: None },
///     initial_tier: TierIndex::SMALLEST,
/// };
/// assert_eq!(hello.queue_pair.num, 17);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The address of the sender's queue pair (number, LID and, for RoCE, GID).
    pub queue_pair: QueuePairAddress,
    /// The tier the sender's connection starts on: the size of the receives it posts
    /// first. Both sides must start on the same tier.
    pub initial_tier: TierIndex,
}

/// A handshake message.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeMessage, decode_frame, encode_frame};
/// let frame = encode_frame(&HandshakeMessage::Ready);
/// assert_eq!(decode_frame(&frame)?, HandshakeMessage::Ready);
/// # Ok::<(), tierbuf_transport::verbs::handshake::HandshakeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeMessage {
    /// The sender's queue pair and starting tier.
    Hello(Hello),
    /// The sender's queue pair is connected and receives.
    Ready,
}

impl HandshakeMessage {
    fn name(&self) -> &'static str {
        match self {
            HandshakeMessage::Hello(_) => "hello",
            HandshakeMessage::Ready => "ready",
        }
    }
}

/// The message as it is encoded: the tier as its index, so the wire format does not
/// depend on `TierIndex` growing serde support.
#[derive(Serialize, Deserialize)]
enum WireMessage {
    Hello {
        queue_pair: QueuePairAddress,
        initial_tier: u8,
    },
    Ready,
}

impl From<&HandshakeMessage> for WireMessage {
    fn from(message: &HandshakeMessage) -> WireMessage {
        match *message {
            HandshakeMessage::Hello(hello) => WireMessage::Hello {
                queue_pair: hello.queue_pair,
                initial_tier: hello.initial_tier.get(),
            },
            HandshakeMessage::Ready => WireMessage::Ready,
        }
    }
}

impl From<WireMessage> for HandshakeMessage {
    fn from(message: WireMessage) -> HandshakeMessage {
        match message {
            WireMessage::Hello {
                queue_pair,
                initial_tier,
            } => HandshakeMessage::Hello(Hello {
                queue_pair,
                initial_tier: TierIndex::new(initial_tier),
            }),
            WireMessage::Ready => HandshakeMessage::Ready,
        }
    }
}

/// Why a handshake failed. The connection it was on is of no further use.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeError, decode_frame};
/// let error = decode_frame(b"TBVB\0\x09\0\0").unwrap_err();
/// assert!(matches!(error, HandshakeError::UnsupportedVersion { found: 9, .. }));
/// println!("{error}"); // says to run the same release on both sides
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The frame does not start with [`MAGIC`]: the peer is not a tierbuf verbs endpoint.
    #[error(
        "the peer is not a tierbuf verbs endpoint: its frame starts with {found:02x?}, \
         not \"TBVB\"; check the address and port"
    )]
    BadMagic {
        /// The first four bytes received.
        found: [u8; 4],
    },
    /// The peer speaks another handshake version.
    #[error(
        "the peer speaks handshake version {found}, this build speaks {supported}; \
         run the same tierbuf release on both sides"
    )]
    UnsupportedVersion {
        /// The version the peer sent.
        found: u16,
        /// The version this build speaks.
        supported: u16,
    },
    /// The header announces a payload longer than any handshake message.
    #[error("the peer announced a {len}-byte handshake payload; the most is {max}")]
    PayloadTooLong {
        /// The announced length.
        len: u16,
        /// [`MAX_PAYLOAD_LEN`].
        max: u16,
    },
    /// The payload does not decode as a handshake message.
    #[error("the peer's handshake payload is malformed")]
    Malformed {
        /// The decoder's error.
        #[source]
        source: postcard::Error,
    },
    /// The payload decodes but is followed by bytes that belong to no message.
    #[error("the peer's handshake payload has {extra} trailing byte(s)")]
    TrailingBytes {
        /// Bytes left over.
        extra: usize,
    },
    /// A well-formed message arrived where another was due.
    #[error("expected a {expected} message from the peer, got {found}")]
    UnexpectedMessage {
        /// The message due.
        expected: &'static str,
        /// The message that came.
        found: &'static str,
    },
    /// The peer closed the connection before a whole frame arrived.
    #[error(
        "the peer closed the connection during the handshake, after {received} of the \
         {expected} bytes of a frame's {part}"
    )]
    PeerClosed {
        /// `"header"` or `"payload"`.
        part: &'static str,
        /// Bytes of that part received.
        received: usize,
        /// Bytes of that part due.
        expected: usize,
    },
    /// The peer sent nothing for the handshake timeout.
    #[error("the peer sent no handshake {part} within {timeout:?}; is it running and reachable?")]
    TimedOut {
        /// `"hello"` (a peer that connected and never spoke), `"header"` or `"payload"`
        /// (one that stopped within a frame).
        part: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The two sides start on different tiers, so their first receives differ in size.
    #[error(
        "this side starts on {local} and the peer on {peer}; both sides must start on \
         the same tier of the same ladder"
    )]
    InitialTierMismatch {
        /// This side's starting tier.
        local: TierIndex,
        /// The peer's starting tier.
        peer: TierIndex,
    },
    /// A socket operation failed.
    #[error("the handshake socket failed in {operation}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

/// Encodes `message` as one frame.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HEADER_LEN, HandshakeMessage, MAGIC, encode_frame};
/// let frame = encode_frame(&HandshakeMessage::Ready);
/// assert_eq!(frame[..4], MAGIC);
/// assert!(frame.len() > HEADER_LEN);
/// ```
pub fn encode_frame(message: &HandshakeMessage) -> Vec<u8> {
    let mut payload = [0u8; MAX_PAYLOAD_LEN as usize];
    // A message is a few dozen bytes, far below the buffer, and postcard encodes every
    // value of these types; failing here would be a bug in this module.
    let used = postcard::to_slice(&WireMessage::from(message), &mut payload)
        .expect("a handshake message fits its payload buffer")
        .len();
    let mut frame = Vec::with_capacity(HEADER_LEN + used);
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&VERSION.to_be_bytes());
    // `used <= MAX_PAYLOAD_LEN`, so it fits a u16.
    frame.extend_from_slice(&(used as u16).to_be_bytes());
    frame.extend_from_slice(&payload[..used]);
    frame
}

/// Checks a frame header and returns the payload length it announces.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeError, check_header};
/// assert_eq!(check_header(*b"TBVB\0\x01\0\x05")?, 5);
/// assert!(matches!(check_header(*b"HTTP/1.1"), Err(HandshakeError::BadMagic { .. })));
/// # Ok::<(), HandshakeError>(())
/// ```
pub fn check_header(header: [u8; HEADER_LEN]) -> Result<u16, HandshakeError> {
    let magic = [header[0], header[1], header[2], header[3]];
    if magic != MAGIC {
        return Err(HandshakeError::BadMagic { found: magic });
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != VERSION {
        return Err(HandshakeError::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    let len = u16::from_be_bytes([header[6], header[7]]);
    if len > MAX_PAYLOAD_LEN {
        return Err(HandshakeError::PayloadTooLong {
            len,
            max: MAX_PAYLOAD_LEN,
        });
    }
    Ok(len)
}

/// Decodes a payload into a message; it must be used whole.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HEADER_LEN, HandshakeError, HandshakeMessage, decode_payload, encode_frame};
/// let frame = encode_frame(&HandshakeMessage::Ready);
/// assert_eq!(decode_payload(&frame[HEADER_LEN..])?, HandshakeMessage::Ready);
/// assert!(matches!(decode_payload(&[9]), Err(HandshakeError::Malformed { .. })));
/// # Ok::<(), HandshakeError>(())
/// ```
pub fn decode_payload(payload: &[u8]) -> Result<HandshakeMessage, HandshakeError> {
    let (message, rest) = postcard::take_from_bytes::<WireMessage>(payload)
        .map_err(|source| HandshakeError::Malformed { source })?;
    if !rest.is_empty() {
        return Err(HandshakeError::TrailingBytes { extra: rest.len() });
    }
    Ok(message.into())
}

/// Decodes one frame held in memory, which must be used whole; a frame cut short is
/// reported as a peer that closed mid-frame.
///
/// ```
/// use tierbuf_transport::verbs::handshake::{HandshakeError, HandshakeMessage, decode_frame, encode_frame};
/// let frame = encode_frame(&HandshakeMessage::Ready);
/// assert!(matches!(decode_frame(&frame[..5]), Err(HandshakeError::PeerClosed { part: "header", .. })));
/// ```
pub fn decode_frame(frame: &[u8]) -> Result<HandshakeMessage, HandshakeError> {
    let mut rest = frame;
    let message = read_message(&mut rest, Duration::ZERO)?;
    if !rest.is_empty() {
        return Err(HandshakeError::TrailingBytes { extra: rest.len() });
    }
    Ok(message)
}

/// Writes `message` as one frame.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::verbs::handshake::{HandshakeMessage, read_message, write_message};
/// let mut wire = Vec::new();
/// write_message(&mut wire, &HandshakeMessage::Ready)?;
/// assert_eq!(read_message(&mut &wire[..], Duration::from_secs(1))?, HandshakeMessage::Ready);
/// # Ok::<(), tierbuf_transport::verbs::handshake::HandshakeError>(())
/// ```
pub fn write_message<W: Write>(
    writer: &mut W,
    message: &HandshakeMessage,
) -> Result<(), HandshakeError> {
    writer
        .write_all(&encode_frame(message))
        .and_then(|()| writer.flush())
        .map_err(|source| HandshakeError::Io {
            operation: "sending a handshake frame",
            source,
        })
}

/// Reads one frame and decodes its message. `timeout` is the reader's own read timeout,
/// named in the error when a read times out.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::verbs::handshake::{HandshakeError, HandshakeMessage, encode_frame, read_message};
/// let frame = encode_frame(&HandshakeMessage::Ready);
/// let mut cut = &frame[..frame.len() - 1];
/// assert!(matches!(
///     read_message(&mut cut, Duration::from_secs(1)),
///     Err(HandshakeError::PeerClosed { part: "payload", .. })
/// ));
/// ```
pub fn read_message<R: Read>(
    reader: &mut R,
    timeout: Duration,
) -> Result<HandshakeMessage, HandshakeError> {
    let mut header = [0u8; HEADER_LEN];
    read_part(reader, &mut header, "header", timeout)?;
    let len = check_header(header)?;
    let mut payload = [0u8; MAX_PAYLOAD_LEN as usize];
    let payload = &mut payload[..usize::from(len)];
    read_part(reader, payload, "payload", timeout)?;
    decode_payload(payload)
}

/// Fills `buf`, telling a peer that closed part-way from one that timed out.
fn read_part<R: Read>(
    reader: &mut R,
    buf: &mut [u8],
    part: &'static str,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    let mut received = 0;
    while received < buf.len() {
        match reader.read(&mut buf[received..]) {
            Ok(0) => {
                return Err(HandshakeError::PeerClosed {
                    part,
                    received,
                    expected: buf.len(),
                });
            }
            Ok(read) => received += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(HandshakeError::TimedOut { part, timeout });
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                return Err(HandshakeError::PeerClosed {
                    part,
                    received,
                    expected: buf.len(),
                });
            }
            Err(source) => {
                return Err(HandshakeError::Io {
                    operation: "receiving a handshake frame",
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Sends `local` and returns the peer's hello, refusing a peer that starts on another
/// tier. `timeout` is the stream's read timeout, named in the error when it passes.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{HandshakeError, Hello, QueuePairAddress, exchange_hello};
/// let hello = |num, tier| Hello {
///     queue_pair: QueuePairAddress { num, lid: 1, gid: None },
///     initial_tier: TierIndex::new(tier),
/// };
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut client = TcpStream::connect(listener.local_addr()?)?;
/// let (mut server, _) = listener.accept()?;
/// let peer = std::thread::spawn(move || exchange_hello(&mut server, hello(2, 1), Duration::from_secs(5)));
/// let refused = exchange_hello(&mut client, hello(1, 0), Duration::from_secs(5));
/// assert!(matches!(refused, Err(HandshakeError::InitialTierMismatch { .. })));
/// assert!(peer.join().unwrap().is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn exchange_hello<S: Read + Write>(
    stream: &mut S,
    local: Hello,
    timeout: Duration,
) -> Result<Hello, HandshakeError> {
    write_message(stream, &HandshakeMessage::Hello(local))?;
    let peer = match read_message(stream, timeout)? {
        HandshakeMessage::Hello(peer) => peer,
        other => {
            return Err(HandshakeError::UnexpectedMessage {
                expected: "hello",
                found: other.name(),
            });
        }
    };
    if peer.initial_tier != local.initial_tier {
        return Err(HandshakeError::InitialTierMismatch {
            local: local.initial_tier,
            peer: peer.initial_tier,
        });
    }
    Ok(peer)
}

/// Says this side is ready and waits for the peer to say so too.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use tierbuf_transport::verbs::handshake::exchange_ready;
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut client = TcpStream::connect(listener.local_addr()?)?;
/// let (mut server, _) = listener.accept()?;
/// let peer = std::thread::spawn(move || exchange_ready(&mut server, Duration::from_secs(5)));
/// exchange_ready(&mut client, Duration::from_secs(5)).unwrap();
/// peer.join().unwrap().unwrap();
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn exchange_ready<S: Read + Write>(
    stream: &mut S,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    write_message(stream, &HandshakeMessage::Ready)?;
    match read_message(stream, timeout)? {
        HandshakeMessage::Ready => Ok(()),
        other => Err(HandshakeError::UnexpectedMessage {
            expected: "ready",
            found: other.name(),
        }),
    }
}
