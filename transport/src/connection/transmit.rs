//! How a [`ConnectionCore`]'s work reaches a provider endpoint: [`Transmit`], which every
//! [`Endpoint`] is, and [`ConnectionCore::transmit`], which hands it the work in order.
//!
//! # Invariants
//!
//! - The core queues work in the order the peer must see it and hands it out in that
//!   order: a post refused for a full queue stays first, and the next `transmit` offers
//!   it again before anything behind it.
//! - A [`Post`] names a buffer the core holds (a receive slot in `posted`, a send slot in
//!   `sending`) until the completion that names its `wr_id` comes back through
//!   [`ConnectionCore::handle_completion`]. A `Post` is made only here, borrows the core
//!   for the one call, and is neither `Clone` nor kept: a transmitter cannot post a
//!   buffer twice, nor after the core let it go.
//! - A frame whose payload lies in the caller's message ([`Post::SendFrom`]) exists only
//!   during the call that has the message ([`ConnectionCore::try_send`],
//!   [`ConnectionCore::try_send_some`]): offered to
//!   the transmitter from the message, and if it is not taken by the time the call
//!   returns, written into the send slot reserved for it and queued as a
//!   [`Post::Send`]. So the compiler checks that nothing refers to the message after it:
//!   the borrow ends with the call.
//! - A post refused for any reason but a full queue fails the connection
//!   ([`Transmit::refused`] says with what) and every request still queued is taken back
//!   as flushed; a send that carried message bytes then counts as not delivered.
//! - An exposure ([`Exposure`]) is made only here, of the staging region the core holds
//!   for the message it exposes (`rendezvous.rs`), right before the frame that tells the
//!   peer of it is posted, and only once: the frame then waits in the queue as a plain
//!   send. Its revocation is queued behind the work that was queued before the peer said
//!   it read the message.

use std::marker::PhantomData;

use tierbuf_tiers::OwnedTierSlot;

use super::core::ConnectionCore;
use super::errors::{ConnectionError, WorkKind};
use super::header::HEADER_LEN;
use crate::error::PostError;
use crate::exposure::Access;
use crate::provider::{BufferRef, CallerCopies, Endpoint, RemoteBuffer};

/// One work request the core hands its transmitter, borrowed for one
/// [`Transmit::post`] call (module invariants).
#[derive(Debug)]
#[non_exhaustive]
pub enum Post<'a> {
    /// Post `buffer` as a receive.
    #[non_exhaustive]
    Recv {
        /// The id its completion will carry.
        wr_id: u64,
        /// The receive buffer, a slot the core holds until that completion.
        buffer: BufferRef,
        /// Ties the post to the core's borrow.
        held: PhantomData<&'a ()>,
    },
    /// Post `buffer` as a send.
    #[non_exhaustive]
    Send {
        /// The id its completion will carry.
        wr_id: u64,
        /// The frame, in a send slot the core holds until that completion.
        buffer: BufferRef,
        /// Ties the post to the core's borrow.
        held: PhantomData<&'a ()>,
    },
    /// Send `header` then `payload`, copied by the provider from where they are (the
    /// payload is in the caller's message): [`Endpoint::try_post_send_copied`]. `Ok(false)`
    /// from [`Transmit::post`] declines it, and the core posts the frame from its send
    /// slot instead, as a [`Post::Send`].
    #[non_exhaustive]
    SendFrom {
        /// The id its completion will carry.
        wr_id: u64,
        /// The frame's header.
        header: &'a [u8],
        /// The frame's payload.
        payload: &'a [u8],
    },
    /// Read `remote`, a range the peer exposed to this connection, into `buffer`:
    /// [`Endpoint::post_read`]. Its completion ([`Opcode::Read`](crate::Opcode::Read))
    /// carries `wr_id`.
    #[non_exhaustive]
    Read {
        /// The id its completion will carry.
        wr_id: u64,
        /// Where the bytes go, a region the core holds until that completion.
        buffer: BufferRef,
        /// The peer's range, as long as `buffer`.
        remote: RemoteBuffer,
        /// Ties the post to the core's borrow.
        held: PhantomData<&'a ()>,
    },
}

/// A range of a region the core holds that it asks its transmitter to expose to the peer
/// ([`Transmit::expose`]): made only by the core (module invariants), for the one call.
#[derive(Debug)]
pub struct Exposure<'a> {
    buffer: BufferRef,
    access: Access,
    held: PhantomData<&'a ()>,
}

impl Exposure<'_> {
    pub(super) fn new<'a>(buffer: BufferRef, access: Access) -> Exposure<'a> {
        Exposure {
            buffer,
            access,
            held: PhantomData,
        }
    }

    /// The range to expose.
    pub fn buffer(&self) -> BufferRef {
        self.buffer
    }

    /// What the peer may do with it.
    pub fn access(&self) -> Access {
        self.access
    }
}

/// Where a [`ConnectionCore`]'s work goes: a provider endpoint, or whatever a test or
/// another driver puts in its place. Every [`Endpoint`] is one.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use tierbuf_pool::{HostRegistrar, MemoryBudget};
/// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// use tierbuf_transport::PostError;
/// use tierbuf_transport::connection::{ConnectionConfig, ConnectionCore, Post, Transmit};
///
/// /// Counts receives and takes nothing else.
/// #[derive(Default)]
/// struct Receives(u64);
/// impl Transmit for Receives {
///     fn post(&mut self, post: Post<'_>) -> Result<bool, PostError> {
///         match post {
///             Post::Recv { .. } => self.0 += 1,
///             other => panic!("only receives: {other:?}"),
///         }
///         Ok(true)
///     }
/// }
///
/// let ladder = TierLadder::builder().tier(8192, 4, 8000).build()?;
/// let config = Arc::new(ConnectionConfig::new(Arc::new(ladder))?);
/// let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(1 << 20)));
/// let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
/// let mut core = ConnectionCore::new(config, Arc::clone(&reservoir), reservoir, Instant::now())?;
/// let mut receives = Receives::default();
/// assert_eq!(core.transmit(&mut receives), 4, "the first receives, one per slot");
/// assert_eq!(receives.0, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Transmit {
    /// Posts `post`: `Ok(true)` once posted; `Ok(false)` only for a [`Post::SendFrom`] the
    /// provider does not copy now (the core then offers the frame again from its slot).
    ///
    /// # Errors
    ///
    /// [`PostError::QueueFull`] keeps the request, first, for the next
    /// [`ConnectionCore::transmit`]; any other error fails the connection.
    fn post(&mut self, post: Post<'_>) -> Result<bool, PostError>;

    /// The frame lengths (header and payload) [`Transmit::post`] takes as a
    /// [`Post::SendFrom`], copying them from the caller's memory; the core offers no
    /// other. None by default.
    fn takes_from_caller(&self) -> CallerCopies {
        CallerCopies::NONE
    }

    /// The failure of a connection whose post was refused with `error`; by default the
    /// post's own error. An endpoint reports why it broke, when it knows.
    fn refused(&mut self, error: PostError) -> ConnectionError {
        ConnectionError::of_post(error)
    }

    /// Exposes `exposure`'s range to the peer ([`Endpoint::expose`]) and returns what to
    /// tell it. The default, for a transmitter with no one-sided operations, refuses
    /// ([`PostError::Unsupported`]): a connection over it must use
    /// [`DataPath::TwoSided`](super::DataPath::TwoSided).
    ///
    /// # Errors
    ///
    /// As [`Endpoint::expose`]; any error fails the connection.
    fn expose(&mut self, exposure: Exposure<'_>) -> Result<RemoteBuffer, PostError> {
        let _ = exposure;
        Err(PostError::Unsupported {
            operation: "expose",
        })
    }

    /// Ends an exposure made by [`Transmit::expose`] ([`Endpoint::revoke`]). The default
    /// refuses, as [`Transmit::expose`] does.
    ///
    /// # Errors
    ///
    /// As [`Endpoint::revoke`]; any error fails the connection.
    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        let _ = exposed;
        Err(PostError::Unsupported {
            operation: "revoke",
        })
    }
}

impl<E: Endpoint + ?Sized> Transmit for E {
    fn post(&mut self, post: Post<'_>) -> Result<bool, PostError> {
        // SAFETY: a `Post` is made only by the core, for a slot it holds until the
        // completion that names `wr_id` comes back to it, and it touches the slot only as
        // `Endpoint::post_recv` and `Endpoint::post_send` allow (module invariants; the
        // core's invariants). If the endpoint is dropped first, closing it gives up every
        // buffer before the core's slots are released (`Connection`'s `Drop`).
        unsafe {
            match post {
                Post::Recv { wr_id, buffer, .. } => self.post_recv(buffer, wr_id).map(|()| true),
                Post::Send { wr_id, buffer, .. } => self.post_send(&[buffer], wr_id).map(|()| true),
                Post::SendFrom {
                    wr_id,
                    header,
                    payload,
                } => self.try_post_send_copied(&[header, payload], wr_id),
                Post::Read {
                    wr_id,
                    buffer,
                    remote,
                    ..
                } => self.post_read(buffer, remote, wr_id).map(|()| true),
            }
        }
    }

    fn expose(&mut self, exposure: Exposure<'_>) -> Result<RemoteBuffer, PostError> {
        // SAFETY: an `Exposure` is made only by the core, of the staging region it holds
        // for the message it exposes for reading; it writes no byte of that region from
        // the copy that fills it until the exposure is revoked (`rendezvous.rs`, module
        // invariants), and no request names it. If the endpoint is dropped first, closing
        // it ends the exposure before the core lets the region go (`Connection`'s `Drop`).
        unsafe { Endpoint::expose(self, exposure.buffer, exposure.access) }
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        Endpoint::revoke(self, exposed)
    }

    fn takes_from_caller(&self) -> CallerCopies {
        self.caller_copies()
    }

    /// A refusal because the connection is already broken says nothing of why: the
    /// endpoint's own report (what its next poll returns: the peer died, broke the
    /// protocol, stalled) is the failure, when it has one.
    fn refused(&mut self, error: PostError) -> ConnectionError {
        if error == PostError::ConnectionBroken
            && let Err(cause) = self.poll(&mut [])
        {
            return ConnectionError::of_transport(cause);
        }
        ConnectionError::of_post(error)
    }
}

/// A request the core has queued for its transmitter.
#[derive(Debug)]
pub(super) enum Queued {
    Recv {
        wr_id: u64,
        buffer: BufferRef,
    },
    Send {
        wr_id: u64,
        buffer: BufferRef,
    },
    /// A frame whose payload is `payload_len` bytes at `payload_at` of the message being
    /// offered, with its send slot, reserved and unwritten (module invariants); its place
    /// in `sending` holds no slot meanwhile.
    SendFrom {
        wr_id: u64,
        header: [u8; HEADER_LEN],
        payload_at: usize,
        payload_len: usize,
        slot: OwnedTierSlot,
    },
    /// The frame that tells the peer of the message the core exposes, header written and
    /// descriptor not: the exposure is made when it reaches the front (module
    /// invariants), and it goes on as a [`Queued::Send`]. Its place in `sending` holds no
    /// slot meanwhile.
    Expose {
        wr_id: u64,
        slot: OwnedTierSlot,
        /// The staged message: the range to expose.
        staged: BufferRef,
    },
    /// A read of the message the peer exposed, into the region the core holds for it.
    Read {
        buffer: BufferRef,
        remote: RemoteBuffer,
    },
    /// The end of the exposure of a message the peer said it read.
    Revoke {
        remote: RemoteBuffer,
    },
}

impl ConnectionCore {
    /// Hands `to` the work queued, in order, until it is all posted or `to` refuses;
    /// returns how many requests were posted. A driver calls it after every call that may
    /// queue work (`ConnectionCore`'s contract).
    pub fn transmit(&mut self, to: &mut impl Transmit) -> usize {
        self.transmit_from(to, &[])
    }

    /// [`ConnectionCore::transmit`] while `message`, the message being offered, is at
    /// hand: the frames that lie in it are offered as [`Post::SendFrom`]; those still
    /// queued at the end are written into their send slots (module invariants).
    pub(super) fn transmit_from(&mut self, to: &mut impl Transmit, message: &[u8]) -> usize {
        let mut posted = 0;
        // The front is offered where it lies and taken off only once posted: most passes
        // post everything, and a request moved out and back costs its size twice.
        while let Some(front) = self.work.front() {
            let outcome = match front {
                Queued::Recv { wr_id, buffer } => to.post(Post::Recv {
                    wr_id: *wr_id,
                    buffer: *buffer,
                    held: PhantomData,
                }),
                Queued::Send { wr_id, buffer } => to.post(Post::Send {
                    wr_id: *wr_id,
                    buffer: *buffer,
                    held: PhantomData,
                }),
                Queued::SendFrom {
                    wr_id,
                    header,
                    payload_at,
                    payload_len,
                    ..
                } => to.post(Post::SendFrom {
                    wr_id: *wr_id,
                    header,
                    payload: &message[*payload_at..payload_at + *payload_len],
                }),
                Queued::Read { buffer, remote } => to.post(Post::Read {
                    wr_id: super::rendezvous::READ_WR_ID,
                    buffer: *buffer,
                    remote: *remote,
                    held: PhantomData,
                }),
                Queued::Expose { staged, .. } => match self.expose_staged(to, *staged) {
                    // The frame now says where the message is: post it at once.
                    Ok(()) => continue,
                    Err(error) => Err(error),
                },
                Queued::Revoke { remote } => {
                    let remote = *remote;
                    to.revoke(remote).map(|()| self.revoked(remote))
                }
            };
            match outcome {
                Ok(true) => {
                    // A frame the provider copied: its slot goes back to the spares, and
                    // its place in `sending` waits for the completion. A revocation is
                    // no request: nothing completes for it.
                    match self.work.pop_front() {
                        Some(Queued::SendFrom { slot, .. }) => self.keep_send_slot(slot),
                        Some(Queued::Revoke { .. }) => continue,
                        _ => {}
                    }
                    posted += 1;
                }
                // Declined: the frame goes from its slot, offered again at once.
                Ok(false) => {
                    if let Some(front) = self.work.pop_front() {
                        let from_slot = self.write_into_slot(front, message);
                        self.work.push_front(from_slot);
                    }
                }
                Err(PostError::QueueFull { .. }) => break,
                Err(error) => {
                    self.refused(to, error);
                    break;
                }
            }
        }
        if self
            .work
            .iter()
            .any(|queued| matches!(queued, Queued::SendFrom { .. }))
        {
            let queued = std::mem::take(&mut self.work);
            self.work = queued
                .into_iter()
                .map(|queued| self.write_into_slot(queued, message))
                .collect();
        }
        posted
    }

    /// `queued`, written into its reserved send slot if it is a [`Queued::SendFrom`] of
    /// `message`: the send to post from the slot, which `sending` now holds. Any other
    /// request comes back as it is.
    fn write_into_slot(&mut self, queued: Queued, message: &[u8]) -> Queued {
        let Queued::SendFrom {
            wr_id,
            header,
            payload_at,
            payload_len,
            mut slot,
        } = queued
        else {
            return queued;
        };
        let len = HEADER_LEN + payload_len;
        slot[..HEADER_LEN].copy_from_slice(&header);
        slot[HEADER_LEN..len].copy_from_slice(&message[payload_at..payload_at + payload_len]);
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: len as u32,
        };
        self.sending[wr_id as usize] = Some(slot);
        Queued::Send { wr_id, buffer }
    }

    /// Fails the connection after `to` refused a post with `error` (not for a full
    /// queue), and takes back every request still queued, as flushed.
    pub(super) fn refused(&mut self, to: &mut impl Transmit, error: PostError) {
        let failure = to.refused(error);
        self.fail(failure);
        self.take_back_queued();
    }

    /// Takes back every request still queued, as flushed: the connection failed and none
    /// will be posted.
    fn take_back_queued(&mut self) {
        for queued in std::mem::take(&mut self.work) {
            match queued {
                Queued::Recv { wr_id, .. } => self.take_back(WorkKind::Recv, wr_id),
                Queued::Send { wr_id, .. } => self.take_back(WorkKind::Send, wr_id),
                // Message bytes, whatever its slot holds (nothing yet).
                Queued::SendFrom { wr_id, .. } | Queued::Expose { wr_id, .. } => {
                    self.sending.try_remove(wr_id as usize);
                    self.lost_data = true;
                }
                // The message the peer exposed is not read: the connection failed, and
                // the peer hears of it as its own failure. A revocation not made leaves
                // the staging region held until the endpoint is closed
                // (`rendezvous.rs`).
                Queued::Read { .. } | Queued::Revoke { .. } => {}
            }
        }
    }
}
