//! The seam through which a user's own system carries the negotiation's control frames.
//!
//! A [`Negotiator`] moves encoded frames over whatever channel the system already has (an
//! RPC connection, a storage engine's replication stream); `pump` moves a [`Negotiation`]'s
//! messages through it. [`InMemoryNegotiator`] joins two endpoints in one process.
//!
//! # Invariants
//!
//! - A frame handed to [`Negotiator::send_frame`] is one whole encoded message; a frame from
//!   [`Negotiator::recv_frame`] is decoded and validated before the negotiation sees it, and a
//!   frame that fails is reported as `PumpError::Decode`, never a panic.
//! - `pump` loses nothing on error: a message that could not be sent is handed back in
//!   `PumpError::Send`, received frames after a bad one stay in the channel for the next call.
//! - The channel must deliver frames in the order they were sent, relative to the data of the
//!   connection, for the release of a tier to follow the last message sent on it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::negotiation::Negotiation;
use crate::wire::{self, ControlMessage, MAX_FRAME_LEN, WireError};

/// Carries control frames to the peer's [`Negotiation`] and back.
pub trait Negotiator {
    /// Why the channel failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Sends one whole frame.
    fn send_frame(&mut self, frame: &[u8]) -> Result<(), Self::Error>;

    /// Copies the next received frame into `buf` and returns its length, or `None` if no frame
    /// is waiting. `buf` holds [`MAX_FRAME_LEN`] bytes.
    fn recv_frame(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Self::Error>;
}

/// What one [`pump`] moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PumpReport {
    /// Frames sent.
    pub sent: usize,
    /// Frames received and handed to the negotiation.
    pub received: usize,
}

/// Why [`pump`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PumpError<E: std::error::Error + Send + Sync + 'static> {
    /// The channel refused a frame; the message is handed back, unsent.
    #[error("sending {message:?} failed")]
    Send {
        /// The message that was not sent.
        message: ControlMessage,
        /// The channel's error.
        #[source]
        source: E,
    },
    /// The channel failed to receive.
    #[error("receiving a frame failed")]
    Recv(#[source] E),
    /// A received frame is malformed; it was dropped.
    #[error("received a malformed frame")]
    Decode(#[source] WireError),
    /// The negotiation produced a message the codec refuses (a bug, reported not hidden).
    #[error("encoding {message:?} failed")]
    Encode {
        /// The message.
        message: ControlMessage,
        /// Why.
        #[source]
        source: WireError,
    },
}

/// Moves `negotiation`'s messages through `channel` at time `now`: lets due timers fire,
/// sends what is queued, takes in every waiting frame, and sends the answers.
pub(crate) fn pump<N: Negotiator>(
    negotiation: &mut Negotiation,
    channel: &mut N,
    now: Instant,
) -> Result<PumpReport, PumpError<N::Error>> {
    let mut report = PumpReport::default();
    if negotiation
        .poll_timeout()
        .is_some_and(|deadline| deadline <= now)
    {
        negotiation.handle_timeout(now);
    }
    report.sent += send_queued(negotiation, channel)?;
    let mut frame = [0u8; MAX_FRAME_LEN];
    while let Some(len) = channel.recv_frame(&mut frame).map_err(PumpError::Recv)? {
        let bytes = frame
            .get(..len)
            .ok_or(PumpError::Decode(WireError::Truncated {
                needed: len,
                available: MAX_FRAME_LEN,
            }))?;
        let message = wire::decode(bytes).map_err(PumpError::Decode)?;
        negotiation.handle_message(now, message);
        report.received += 1;
    }
    report.sent += send_queued(negotiation, channel)?;
    Ok(report)
}

fn send_queued<N: Negotiator>(
    negotiation: &mut Negotiation,
    channel: &mut N,
) -> Result<usize, PumpError<N::Error>> {
    let mut sent = 0;
    let mut frame = [0u8; MAX_FRAME_LEN];
    while let Some(message) = negotiation.poll_transmit() {
        let len = wire::encode(&message, &mut frame)
            .map_err(|source| PumpError::Encode { message, source })?;
        channel
            .send_frame(&frame[..len])
            .map_err(|source| PumpError::Send { message, source })?;
        sent += 1;
    }
    Ok(sent)
}

/// Why an [`InMemoryNegotiator`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InMemoryError {
    /// The other end was dropped.
    #[error("the peer end of the in-memory channel is gone")]
    Disconnected,
    /// The waiting frame does not fit the buffer; it stays queued.
    #[error("a {len}-byte frame does not fit a {capacity}-byte buffer")]
    FrameTooLarge {
        /// The frame's length.
        len: usize,
        /// The buffer's length.
        capacity: usize,
    },
}

type Queue = Arc<Mutex<VecDeque<Vec<u8>>>>;

/// One end of an in-process channel of frames, for tests and examples.
///
/// ```
/// use tierbuf_tiers::negotiator::{InMemoryNegotiator, Negotiator};
/// let (mut a, mut b) = InMemoryNegotiator::pair();
/// a.send_frame(b"frame")?;
/// let mut buf = [0u8; 8];
/// assert_eq!(b.recv_frame(&mut buf)?, Some(5));
/// assert_eq!(b.recv_frame(&mut buf)?, None);
/// # Ok::<(), tierbuf_tiers::negotiator::InMemoryError>(())
/// ```
#[derive(Debug)]
pub struct InMemoryNegotiator {
    outgoing: Queue,
    incoming: Queue,
}

impl InMemoryNegotiator {
    /// Two ends joined to each other.
    pub fn pair() -> (InMemoryNegotiator, InMemoryNegotiator) {
        let (a_to_b, b_to_a) = (Queue::default(), Queue::default());
        (
            InMemoryNegotiator {
                outgoing: Arc::clone(&a_to_b),
                incoming: Arc::clone(&b_to_a),
            },
            InMemoryNegotiator {
                outgoing: b_to_a,
                incoming: a_to_b,
            },
        )
    }
}

/// Locks a queue; a poisoned lock still guards a queue of whole frames, so it is taken over.
fn lock(queue: &Queue) -> std::sync::MutexGuard<'_, VecDeque<Vec<u8>>> {
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Negotiator for InMemoryNegotiator {
    type Error = InMemoryError;

    fn send_frame(&mut self, frame: &[u8]) -> Result<(), InMemoryError> {
        // Only this end and the peer hold the queue: a count of one means the peer is gone.
        if Arc::strong_count(&self.outgoing) < 2 {
            return Err(InMemoryError::Disconnected);
        }
        lock(&self.outgoing).push_back(frame.to_vec());
        Ok(())
    }

    fn recv_frame(&mut self, buf: &mut [u8]) -> Result<Option<usize>, InMemoryError> {
        let mut incoming = lock(&self.incoming);
        let Some(frame) = incoming.front() else {
            return Ok(None);
        };
        let Some(target) = buf.get_mut(..frame.len()) else {
            return Err(InMemoryError::FrameTooLarge {
                len: frame.len(),
                capacity: buf.len(),
            });
        };
        target.copy_from_slice(frame);
        let len = frame.len();
        incoming.pop_front();
        Ok(Some(len))
    }
}

#[cfg(test)]
mod examples;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::TierIndex;
    use crate::negotiation::{NegotiationConfig, TierShape};
    use std::time::Duration;

    fn negotiation() -> Negotiation {
        let config = NegotiationConfig::new(
            vec![
                TierShape {
                    slot_size: 256,
                    slot_count: 4,
                },
                TierShape {
                    slot_size: 4096,
                    slot_count: 4,
                },
            ],
            Duration::from_millis(5),
            2,
        )
        .expect("valid ladder");
        Negotiation::new(config)
    }

    #[test]
    fn a_malformed_frame_is_an_error_and_later_frames_stay_queued() {
        let (mut a_end, mut b_end) = InMemoryNegotiator::pair();
        let mut b = negotiation();
        a_end.send_frame(&[0xFF; 12]).expect("connected");
        let mut a = negotiation();
        let now = Instant::now();
        a.request_tier(now, TierIndex::new(1))
            .expect("on the ladder");
        pump(&mut a, &mut a_end, now).expect("sent");
        assert!(matches!(
            pump(&mut b, &mut b_end, now),
            Err(PumpError::Decode(WireError::BadHeadFlag { found: 0xFFFF }))
        ));
        let report = pump(&mut b, &mut b_end, now).expect("the request is still there");
        assert_eq!(
            report,
            PumpReport {
                sent: 0,
                received: 1
            }
        );
    }

    #[test]
    fn timers_fire_through_pump_and_a_gone_peer_hands_the_message_back() {
        let (mut a_end, b_end) = InMemoryNegotiator::pair();
        let mut a = negotiation();
        let now = Instant::now();
        a.request_tier(now, TierIndex::new(1))
            .expect("on the ladder");
        assert_eq!(pump(&mut a, &mut a_end, now).expect("sent").sent, 1);
        let later = a.poll_timeout().expect("a retry is due");
        assert_eq!(pump(&mut a, &mut a_end, later).expect("sent").sent, 1);
        drop(b_end);
        let deadline = a.poll_timeout().expect("the last attempt runs");
        match pump(&mut a, &mut a_end, deadline) {
            Err(PumpError::Send {
                message: ControlMessage::Abandon { .. },
                source: InMemoryError::Disconnected,
            }) => {}
            other => panic!("expected the abandon handed back, got {other:?}"),
        }
    }

    #[test]
    fn a_frame_too_large_for_the_buffer_stays_queued() {
        let (mut a_end, mut b_end) = InMemoryNegotiator::pair();
        a_end.send_frame(&[7; 10]).expect("connected");
        let mut small = [0u8; 4];
        assert_eq!(
            b_end.recv_frame(&mut small),
            Err(InMemoryError::FrameTooLarge {
                len: 10,
                capacity: 4
            })
        );
        let mut big = [0u8; 16];
        assert_eq!(b_end.recv_frame(&mut big), Ok(Some(10)));
    }
}
