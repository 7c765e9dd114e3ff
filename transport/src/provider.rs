//! The verbs-shaped provider interface: [`Provider`], [`Endpoint`], the buffers they name
//! ([`BufferRef`]) and the completions they report ([`Completion`]).
//!
//! Every provider keeps the verbs rules listed on [`Endpoint`]; a connection written
//! against these traits behaves the same on loopback, shared memory and hardware.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::task::Waker;

use tierbuf_pool::{OwnedSlot, Registrar, Slot};

use crate::error::{PostError, QueueKind, TransportError};
use crate::exposure::Access;

/// A transport provider: the memory registration and the endpoints of one kind of
/// transport (loopback, shared memory, verbs hardware).
///
/// How endpoints are connected differs by provider (an in-process pair, a rendezvous
/// socket, an exchange of queue-pair numbers), so connecting is each provider's own
/// constructor; what the connection layer needs afterwards is on [`Endpoint`].
///
/// ```
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::{LoopbackProvider, Provider};
/// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&*provider.registrar(), 4096, 4)?;
/// assert_eq!(provider.name(), "loopback");
/// assert_eq!(provider.registrar().budget().in_use(), 4 * 4096);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
pub trait Provider: Send + Sync + fmt::Debug {
    /// The endpoints this provider connects.
    type Endpoint: Endpoint;

    /// A short name for logs and reports (`"loopback"`, `"shm"`, `"verbs"`).
    fn name(&self) -> &'static str;

    /// The registrar whose regions this provider's endpoints can send from and receive
    /// into. Memory registered elsewhere is unknown to the provider (as a verbs memory
    /// region belongs to one protection domain): naming it fails with
    /// [`PostError::UnknownKey`].
    fn registrar(&self) -> Arc<dyn Registrar>;
}

/// One side of a connection, shaped like a verbs reliable-connected queue pair with its
/// completion queues.
///
/// # The verbs rules every provider keeps
///
/// - **Two-sided.** A send is delivered into the receive buffer the peer posted first
///   and has not consumed yet: receives are consumed in the order they were posted.
/// - **Receiver not ready waits.** A send with no posted receive waits until the peer
///   posts one (reliable connection with infinite RNR retry); it is never dropped.
/// - **Length.** A message longer than the receive buffer it meets is not delivered: the
///   receive completes with [`CompletionStatus::LocalLengthError`], the send with
///   [`CompletionStatus::RemoteInvalidRequest`], and nothing is written past the receive
///   buffer (the software providers write nothing at all). A device may report the same
///   failure as [`CompletionStatus::LocalOperationError`] and
///   [`CompletionStatus::RemoteOperationError`], as soft-RoCE does. As in verbs, any
///   error completion breaks the connection ([`EndpointState::Broken`]): every later
///   request of either side is flushed.
/// - **Keys and bounds.** Every buffer must lie inside a live region registered with the
///   provider, found by its remote key; anything else is refused when posted
///   ([`PostError::UnknownKey`], [`PostError::OutOfBounds`]). A region deregistered while
///   a request still names it completes that request with
///   [`CompletionStatus::LocalProtectionError`]; its memory is never touched after
///   deregistration in a way that can corrupt anything.
/// - **Order.** Completions of one queue (sends, receives) come in posting order.
/// - **Depth.** At most [`EndpointLimits::send_depth`] sends and
///   [`EndpointLimits::recv_depth`] receives are outstanding (posted and not yet polled
///   as completions); past that, posting fails with [`PostError::QueueFull`].
/// - **Close.** [`Endpoint::close`] (and drop) flushes every outstanding request of
///   both sides with [`CompletionStatus::Flushed`]; posting afterwards fails with
///   [`PostError::Closed`] here and [`PostError::PeerClosed`] at the peer.
///
/// # The one-sided rules
///
/// - **Exposure.** [`Endpoint::expose`] lets this endpoint's peer, and no other, write or
///   read one range of a registered region, and gives the [`RemoteBuffer`] to tell it;
///   [`Endpoint::revoke`] ends that. A key is refused on every other connection, and on
///   this one once revoked: a write or read that names it, or names bytes outside its
///   range, or asks an access it was not given, touches no byte, completes at its
///   poster with [`CompletionStatus::RemoteAccessError`] and breaks the connection on
///   both sides (verbs: the responder's queue pair goes to the error state too). At most
///   [`EXPOSURE_SLOTS`](crate::EXPOSURE_SLOTS) exposures of one endpoint are in force.
/// - **Writes and reads are sends.** [`Endpoint::post_write`] and [`Endpoint::post_read`]
///   go on the send queue: they count in its depth, and they are carried out, and
///   complete ([`Opcode::Write`], [`Opcode::Read`]), in posting order with the sends. A
///   write with an immediate consumes the peer's oldest posted receive (a zero-length one
///   is enough), and waits for one as a send does; the receive completes with
///   [`Opcode::RecvWithImm`] and the write's byte count once the written bytes are
///   visible. A write without one completes only at its poster.
///
/// Work-request ids are the caller's: the provider hands them back in completions and
/// never interprets them. The endpoint does not own the buffers' handles; the caller
/// keeps them (for example in a `slab` keyed by work-request id) until the completion.
pub trait Endpoint: Send + fmt::Debug {
    /// The queue depths and gather limit of this endpoint.
    fn limits(&self) -> EndpointLimits;

    /// Whether the connection is open, closed by either side, or broken by an error.
    fn state(&self) -> EndpointState;

    /// Sends and receives posted and not yet returned by [`Endpoint::poll`].
    fn outstanding(&self) -> Outstanding;

    /// Posts `buffer` to receive the next message the peer sends; its completion carries
    /// `wr_id`.
    ///
    /// # Safety
    ///
    /// From this call until the completion carrying `wr_id` has been returned by
    /// [`Endpoint::poll`], or until this endpoint has been closed or dropped, nothing but
    /// the provider reads or writes the bytes `buffer` names, and no other outstanding
    /// request of any endpoint names any of them. An error return ends this at once:
    /// nothing was posted. Besides, while this call runs nothing writes any byte of the
    /// region `buffer` lies in: a provider may move the region's memory to share it with
    /// the peer at its first receive (the shm provider does).
    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError>;

    /// Posts a send of the concatenation of the `gather` buffers (at most
    /// [`EndpointLimits::max_gather`]; none sends an empty message); its completion
    /// carries `wr_id`.
    ///
    /// # Safety
    ///
    /// From this call until the completion carrying `wr_id` has been returned by
    /// [`Endpoint::poll`], or until this endpoint has been closed or dropped, nothing
    /// writes the bytes the `gather` buffers name, and no outstanding receive of any
    /// endpoint names any of them. An error return ends this at once: nothing was posted.
    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError>;

    /// The sends, by length, that are better given to [`Endpoint::try_post_send_copied`]
    /// than copied into a registered buffer and posted: a software provider that copies
    /// messages itself can copy one from the caller's memory, and says for which lengths
    /// that costs less; a verbs NIC reads only registered memory, but for the few bytes it
    /// takes inline, copied into the work request (the verbs provider names those). The
    /// default is [`CallerCopies::NONE`].
    fn caller_copies(&self) -> CallerCopies {
        CallerCopies::NONE
    }

    /// Sends the concatenation of `parts` (at most [`EndpointLimits::max_gather`]) from
    /// the caller's own memory, registered or not, if the provider can copy it into a
    /// receive the peer has posted at once, with no send of this endpoint waiting ahead of
    /// it: `Ok(true)` when it has, and the send completes as any other (its completion
    /// carries `wr_id`); `Ok(false)` when it cannot now, having taken nothing (post it
    /// from registered memory instead). Nothing of `parts` is read after the call.
    ///
    /// The verbs provider copies a send short enough into its work request instead (inline
    /// data), so it takes one whether or not a receive is posted; the send then waits for
    /// the peer's receive, in order with the sends around it, as a posted one does. It
    /// takes up to four parts whatever [`EndpointLimits::max_gather`] says, since the CPU
    /// copies them.
    ///
    /// The default, for providers that read only registered memory, takes nothing.
    ///
    /// ```
    /// use tierbuf_pool::{MemoryBudget, SlotPool};
    /// use tierbuf_transport::{BufferRef, Completion, Endpoint, Provider, ShmProvider};
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// let pool = SlotPool::new(&*provider.registrar(), 256, 1)?;
    /// let (mut client, mut server) = provider.pair(4, 4)?;
    /// assert!(client.caller_copies().takes(5));
    /// // No receive posted yet: nothing is taken.
    /// assert!(!client.try_post_send_copied(&[b"he", b"llo"], 1)?);
    /// let inbox = pool.try_acquire_owned().unwrap();
    /// // SAFETY: the inbox is read only after its completion is polled.
    /// unsafe { server.post_recv(BufferRef::from(&inbox), 2)? };
    /// assert!(client.try_post_send_copied(&[b"he", b"llo"], 1)?);
    /// let mut completions = [Completion::default(); 4];
    /// assert_eq!(server.poll(&mut completions)?, 1);
    /// assert_eq!(&inbox[..5], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_post_send_copied(&mut self, parts: &[&[u8]], wr_id: u64) -> Result<bool, PostError> {
        let _ = (parts, wr_id);
        Ok(false)
    }

    /// Exposes `buffer`, a range of a region registered with this provider, to this
    /// endpoint's peer for `access`, and returns what to tell the peer: the range's
    /// address and length, and a key that only this connection's peer can use, until
    /// [`Endpoint::revoke`]. The region's memory stays mapped while the exposure is in
    /// force; if its owner deregisters it meanwhile, the peer's requests are refused as
    /// with a revoked key (verbs refuses to deregister it instead). A region once exposed
    /// says so ([`Region::exposed_to_peer`](tierbuf_pool::Region::exposed_to_peer)), so a
    /// reservoir deregisters it when given back rather than lend it to another
    /// connection.
    ///
    /// # Safety
    ///
    /// While the exposure is in force, the peer writes (for [`Access::Write`]) or reads
    /// (for [`Access::Read`]) its bytes when it chooses: this side reads a byte the peer
    /// may write only once the peer's protocol says no write of it is in flight (the
    /// receive completion of a write with an immediate that covered it, say, and until the
    /// peer is told it may write there again), and writes none of the bytes of an
    /// exposure for reads. No outstanding receive of any endpoint names any of them.
    /// Besides, while this call runs nothing writes any byte of the region `buffer` lies
    /// in: a provider may move the region's memory to share it with the peer (the shm
    /// provider does).
    ///
    /// ```
    /// use tierbuf_pool::{MemoryBudget, SlotPool};
    /// use tierbuf_transport::{Access, BufferRef, Completion, Endpoint, LoopbackProvider, Opcode};
    /// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
    /// let pool = SlotPool::new(&*tierbuf_transport::Provider::registrar(&provider), 256, 3)?;
    /// let (mut writer, mut target) = provider.pair(4, 4)?;
    /// let (source, window, signal) = (
    ///     pool.try_acquire_owned().unwrap(),
    ///     pool.try_acquire_owned().unwrap(),
    ///     pool.try_acquire_owned().unwrap(),
    /// );
    /// // SAFETY: the window is read only after the write's immediate arrives; the source
    /// // is written before the write is posted and not after.
    /// let remote = unsafe { target.expose(BufferRef::from(&window), Access::Write)? };
    /// unsafe { target.post_recv(BufferRef::from(&signal).prefix(0).unwrap(), 1)? };
    /// let mut source = source;
    /// source[..5].copy_from_slice(b"hello");
    /// let at = remote.slice(16, 5).unwrap();
    /// unsafe { writer.post_write(&[BufferRef::from(&source).prefix(5).unwrap()], at, Some(7), 2)? };
    /// let mut completions = [Completion::default(); 4];
    /// assert_eq!(target.poll(&mut completions)?, 1);
    /// assert_eq!(completions[0].opcode, Opcode::RecvWithImm(7));
    /// assert_eq!(completions[0].byte_len, 5);
    /// assert_eq!(&window[16..21], b"hello");
    /// target.revoke(remote)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    unsafe fn expose(
        &mut self,
        buffer: BufferRef,
        access: Access,
    ) -> Result<RemoteBuffer, PostError>;

    /// Ends the exposure `exposed` names ([`Endpoint::expose`]): when it returns `Ok`, the
    /// peer's writes and reads naming it are refused, and none in flight is still touching
    /// its bytes, so the obligations `expose` took on end. A key this endpoint has no
    /// exposure under is [`PostError::UnknownKey`]. If the peer does not end an access in
    /// flight within the provider's deadline (a stalled shm peer), the connection fails
    /// and this returns [`PostError::ConnectionBroken`]: the bytes stay the peer's to touch
    /// until the endpoint is closed, so keep the region until then.
    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError>;

    /// Posts a write of the concatenation of the `gather` buffers (at most
    /// [`EndpointLimits::max_gather`]) into `remote`, a range the peer exposed to this
    /// connection for writing, as long as the message; with `imm`, the write consumes the
    /// peer's oldest posted receive and completes it with the immediate and the byte count
    /// ([`Opcode::RecvWithImm`]). Its completion ([`Opcode::Write`]) carries `wr_id`.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::post_send`]: nothing writes the `gather` bytes until the completion
    /// carrying `wr_id` has been returned, or the endpoint closed.
    unsafe fn post_write(
        &mut self,
        gather: &[BufferRef],
        remote: RemoteBuffer,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<(), PostError>;

    /// Posts a read of `remote`, a range the peer exposed to this connection for reading,
    /// into `buffer` (of the same length). Its completion ([`Opcode::Read`]) carries
    /// `wr_id` and the bytes read.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::post_recv`] for `buffer`: nothing but the provider reads or writes
    /// its bytes until the completion carrying `wr_id` has been returned, or the endpoint
    /// closed, and no other outstanding request names any of them.
    unsafe fn post_read(
        &mut self,
        buffer: BufferRef,
        remote: RemoteBuffer,
        wr_id: u64,
    ) -> Result<(), PostError>;

    /// Makes progress and moves up to `completions.len()` completions into
    /// `completions`, returning how many; never blocks. Each completion ends the
    /// obligation its post took on.
    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError>;

    /// Closes this side: every outstanding request of both sides completes with
    /// [`CompletionStatus::Flushed`] (or has already completed), and when this returns the
    /// provider touches none of this endpoint's buffers again. Closing twice does nothing.
    fn close(&mut self);

    /// How a caller that found nothing to do can sleep until this endpoint may have work
    /// ([`Readiness`]). The default, for providers that cannot wake a sleeper, is
    /// [`Readiness::Polling`].
    fn readiness(&self) -> Readiness<'_> {
        Readiness::Polling
    }

    /// Asks to be woken at the next event that a [`Endpoint::poll`] would act on: a
    /// delivery into a posted receive, a send completing, the peer closing or dying.
    /// [`Armed::Parked`] means nothing is there now, and the wake will come (through the
    /// descriptor of [`Readiness::Fd`], or by a call of `waker` for
    /// [`Readiness::Waker`]); [`Armed::Pending`] means work may be there already: poll
    /// instead of sleeping. Call [`Endpoint::disarm`] after the wait, woken or not.
    ///
    /// An endpoint with a send waiting for the peer's receive stays pending (the peer's
    /// post wakes nobody), so such a wait polls. The default, for providers that cannot
    /// wake anybody, is always pending.
    fn arm(&mut self, waker: &Waker) -> Armed {
        let _ = waker;
        Armed::Pending
    }

    /// Ends a wait begun with [`Endpoint::arm`]: withdraws the request to be woken and
    /// takes the wake, if one came, so that the descriptor is quiet again.
    fn disarm(&mut self) {}
}

/// How a caller can sleep until an endpoint may have work, after
/// [`Endpoint::arm`] said [`Armed::Parked`].
///
/// ```
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_transport::{Endpoint, LoopbackProvider, Readiness, ShmProvider};
/// let (loopback, _peer) = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20)).pair(4, 4)?;
/// assert!(matches!(loopback.readiness(), Readiness::Waker));
/// let (shm, _peer) = ShmProvider::new(MemoryBudget::with_cap(1 << 20)).pair(4, 4)?;
/// assert!(matches!(shm.readiness(), Readiness::Fd(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Readiness<'a> {
    /// The descriptor turns readable (or reports hang-up) when a wake comes: wait for it
    /// with `poll(2)`, an `epoll` set or an async reactor. It is one descriptor per
    /// endpoint for its whole life, so it can stay registered with a reactor. The
    /// shared-memory provider's is its bootstrap socket: a peer in another process can
    /// wake it, and its hang-up tells that the peer process is gone.
    Fd(BorrowedFd<'a>),
    /// The waker given to [`Endpoint::arm`] is called (in-process providers).
    Waker,
    /// Nothing wakes a sleeper: poll the endpoint, backing off while it stays idle.
    Polling,
}

/// What [`Endpoint::arm`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// Nothing to do now: sleep until woken.
    Parked,
    /// Work may be waiting: poll, do not sleep.
    Pending,
}

/// The lengths of the sends an endpoint is better given from the caller's own memory
/// ([`Endpoint::try_post_send_copied`]) than from a registered buffer
/// ([`Endpoint::post_send`]): those of at most a small bound, and those of at least a
/// large one. Between the two, or for a provider that does not copy from the caller at
/// all, a sender copies into a registered buffer and posts that. It is advice measured per
/// provider: `try_post_send_copied` takes a send of any length it can.
///
/// ```
/// use tierbuf_transport::CallerCopies;
/// let copies = CallerCopies::new(Some(104), Some(4096));
/// assert!(copies.takes(80) && copies.takes(65536));
/// assert!(!copies.takes(1024));
/// assert!(!CallerCopies::NONE.takes(80));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerCopies {
    small_up_to: Option<usize>,
    large_from: Option<usize>,
}

impl CallerCopies {
    /// No send is better copied from the caller's memory.
    pub const NONE: CallerCopies = CallerCopies {
        small_up_to: None,
        large_from: None,
    };

    /// Sends of at most `small_up_to` bytes and of at least `large_from` bytes (`None`
    /// for no such sends).
    pub const fn new(small_up_to: Option<usize>, large_from: Option<usize>) -> CallerCopies {
        CallerCopies {
            small_up_to,
            large_from,
        }
    }

    /// Whether a send of `len` bytes is better copied from the caller's memory.
    pub fn takes(self, len: usize) -> bool {
        self.small_up_to.is_some_and(|up_to| len <= up_to)
            || self.large_from.is_some_and(|from| len >= from)
    }
}

/// The limits of an endpoint's queues and messages (verbs `max_send_wr`, `max_recv_wr`,
/// `max_send_sge`, `max_msg_sz`).
///
/// ```
/// use tierbuf_transport::EndpointLimits;
/// let limits = EndpointLimits { send_depth: 16, recv_depth: 64, max_gather: 4, max_message: 1 << 30 };
/// assert!(limits.recv_depth > limits.send_depth);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// Most sends outstanding at once.
    pub send_depth: u32,
    /// Most receives outstanding at once.
    pub recv_depth: u32,
    /// Most buffers in one send's gather list.
    pub max_gather: usize,
    /// Most bytes in one message (verbs `max_msg_sz`).
    pub max_message: u32,
}

/// Work requests posted and not yet returned by [`Endpoint::poll`].
///
/// ```
/// use tierbuf_transport::Outstanding;
/// assert_eq!(Outstanding::default(), Outstanding { sends: 0, recvs: 0 });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outstanding {
    /// Outstanding sends.
    pub sends: u32,
    /// Outstanding receives.
    pub recvs: u32,
}

impl Outstanding {
    /// Moves completions from `next` into `completions` until either runs out, counting
    /// each request no longer outstanding; returns how many it moved.
    pub(crate) fn hand_out(
        &mut self,
        completions: &mut [Completion],
        mut next: impl FnMut() -> Option<Completion>,
    ) -> usize {
        let mut filled = 0;
        for entry in completions.iter_mut() {
            let Some(completion) = next() else {
                break;
            };
            match completion.opcode.queue() {
                QueueKind::Send => self.sends -= 1,
                QueueKind::Recv => self.recvs -= 1,
            }
            *entry = completion;
            filled += 1;
        }
        filled
    }

    /// Refuses a post to `queue` when it already holds its depth of requests.
    pub(crate) fn check_room(
        self,
        queue: QueueKind,
        limits: EndpointLimits,
    ) -> Result<(), PostError> {
        let (outstanding, depth) = match queue {
            QueueKind::Send => (self.sends, limits.send_depth),
            QueueKind::Recv => (self.recvs, limits.recv_depth),
        };
        if outstanding >= depth {
            return Err(PostError::QueueFull { queue, depth });
        }
        Ok(())
    }
}

impl EndpointLimits {
    /// The length of the message `gather` sends, after checking the gather limit and
    /// that the buffers add up to what one message carries.
    pub(crate) fn message_len(self, gather: &[BufferRef]) -> Result<u32, PostError> {
        self.checked_len(gather.iter().map(|buffer| u64::from(buffer.len)))
    }

    /// [`EndpointLimits::message_len`] of a message given by the lengths of its parts.
    pub(crate) fn checked_len(
        self,
        parts: impl ExactSizeIterator<Item = u64>,
    ) -> Result<u32, PostError> {
        if parts.len() > self.max_gather {
            return Err(PostError::TooManyBuffers {
                given: parts.len(),
                max: self.max_gather,
            });
        }
        let total: u64 = parts.sum();
        match u32::try_from(total) {
            Ok(len) if len <= self.max_message => Ok(len),
            _ => Err(PostError::MessageTooLong {
                len: total,
                max: self.max_message,
            }),
        }
    }
}

/// The state of an endpoint's connection.
///
/// ```
/// use tierbuf_transport::EndpointState;
/// assert_ne!(EndpointState::Open, EndpointState::Broken);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointState {
    /// Both sides are open.
    Open,
    /// This side was closed.
    Closed,
    /// The peer closed (or was dropped).
    PeerClosed,
    /// An error completion broke the connection (verbs: the queue pair is in the error
    /// state).
    Broken,
}

/// A buffer inside a registered region, named as a verbs scatter-gather element names it:
/// the region's remote key, the address of the first byte, and a length.
///
/// Regions are found by the key a peer is told ([`RegionKeys::remote_key`](tierbuf_pool::RegionKeys));
/// the verbs provider, whose regions have no remote rights, uses its local key there.
/// Slot handles convert into the buffer of the whole slot; the endpoint never takes the
/// handle, so the caller keeps it until the request completes.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::{BufferRef, LoopbackProvider, Provider};
/// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&*provider.registrar(), 512, 2)?;
/// let slot = pool.try_acquire_owned().unwrap();
/// let whole = BufferRef::from(&slot);
/// assert_eq!((whole.remote_key, whole.addr, whole.len), (slot.keys().remote_key, slot.remote_addr(), 512));
/// assert_eq!(whole.prefix(16).unwrap().len, 16);
/// assert!(whole.prefix(513).is_none());
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferRef {
    /// The remote key of the region the buffer lies in.
    pub remote_key: u32,
    /// The address of the buffer's first byte, in the region's address space
    /// ([`tierbuf_pool::RegionKeys::remote_addr`] names the region's first byte).
    pub addr: u64,
    /// The buffer's length in bytes.
    pub len: u32,
}

impl BufferRef {
    /// The first `len` bytes of this buffer, or `None` when it is shorter than `len`.
    pub fn prefix(self, len: u32) -> Option<BufferRef> {
        (len <= self.len).then_some(BufferRef { len, ..self })
    }

    /// The buffer of a whole slot. A verbs scatter-gather element covers at most
    /// `u32::MAX` bytes, so a longer slot is named by its first `u32::MAX` bytes.
    fn of_slot(remote_key: u32, addr: u64, len: usize) -> BufferRef {
        BufferRef {
            remote_key,
            addr,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        }
    }
}

impl From<&OwnedSlot> for BufferRef {
    fn from(slot: &OwnedSlot) -> BufferRef {
        BufferRef::of_slot(slot.keys().remote_key, slot.remote_addr(), slot.len())
    }
}

impl From<&Slot<'_>> for BufferRef {
    fn from(slot: &Slot<'_>) -> BufferRef {
        BufferRef::of_slot(slot.keys().remote_key, slot.remote_addr(), slot.len())
    }
}

/// What a completion completed, and so which queue it belongs to ([`Opcode::queue`]).
///
/// ```
/// use tierbuf_transport::{Opcode, QueueKind};
/// assert_ne!(Opcode::Send, Opcode::Recv);
/// assert_eq!(Opcode::Write.queue(), QueueKind::Send);
/// assert_eq!(Opcode::RecvWithImm(7).queue(), QueueKind::Recv);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Opcode {
    /// A send (verbs `IBV_WC_SEND`).
    Send,
    /// A receive (verbs `IBV_WC_RECV`).
    Recv,
    /// A one-sided write ([`Endpoint::post_write`]; verbs `IBV_WC_RDMA_WRITE`).
    Write,
    /// A one-sided read ([`Endpoint::post_read`]; verbs `IBV_WC_RDMA_READ`).
    Read,
    /// A receive consumed by the peer's write with this immediate (verbs
    /// `IBV_WC_RECV_RDMA_WITH_IMM`); the completion's `byte_len` is what the write put
    /// into the exposed range, not into the receive's buffer.
    RecvWithImm(u32),
}

impl Opcode {
    /// The queue the request was on.
    pub fn queue(self) -> QueueKind {
        match self {
            Opcode::Send | Opcode::Write | Opcode::Read => QueueKind::Send,
            Opcode::Recv | Opcode::RecvWithImm(_) => QueueKind::Recv,
        }
    }
}

/// A range of the peer's memory that it exposed to this connection
/// ([`Endpoint::expose`]): the key it was given under, the address of its first byte in
/// the peer's address space, and its length. It is what a protocol sends to its peer;
/// any of its parts may be named ([`RemoteBuffer::slice`]).
///
/// ```
/// use tierbuf_transport::RemoteBuffer;
/// let exposed = RemoteBuffer { key: 0x4c1, addr: 0x7000, len: 4096 };
/// assert_eq!(exposed.slice(4000, 96), Some(RemoteBuffer { key: 0x4c1, addr: 0x7000 + 4000, len: 96 }));
/// assert_eq!(exposed.slice(4000, 97), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuffer {
    /// The key the range was exposed under (verbs: a memory window's `rkey`).
    pub key: u32,
    /// The range's first byte, in the exposing side's address space.
    pub addr: u64,
    /// The range's length.
    pub len: u32,
}

impl RemoteBuffer {
    /// Refuses a local message or buffer of `local` bytes for this range unless the
    /// lengths are equal ([`PostError::LengthMismatch`]).
    pub(crate) fn check_len(self, local: u32) -> Result<(), PostError> {
        if local == self.len {
            return Ok(());
        }
        Err(PostError::LengthMismatch {
            local: u64::from(local),
            remote: self.len,
        })
    }

    /// The `len` bytes from `offset`, if they lie inside this range.
    pub fn slice(self, offset: u32, len: u32) -> Option<RemoteBuffer> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteBuffer {
            key: self.key,
            addr: self.addr + u64::from(offset),
            len,
        })
    }
}

/// How a work request ended. Mirrors the `ibv_wc_status` values a two-sided reliable
/// connection produces; the name of each is on its variant.
///
/// ```
/// use tierbuf_transport::CompletionStatus;
/// assert!(CompletionStatus::Success.is_success());
/// assert!(!CompletionStatus::Flushed.is_success());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompletionStatus {
    /// Done (`IBV_WC_SUCCESS`).
    Success,
    /// A receive met a message longer than its buffer; nothing was written
    /// (`IBV_WC_LOC_LEN_ERR`).
    LocalLengthError,
    /// A buffer's region was deregistered before the request was carried out
    /// (`IBV_WC_LOC_PROT_ERR`).
    LocalProtectionError,
    /// This side's queue could not carry out the request as posted; soft-RoCE reports a
    /// receive that met a message longer than its buffer so (`IBV_WC_LOC_QP_OP_ERR`).
    LocalOperationError,
    /// The peer refused the send: its receive buffer was too short
    /// (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The peer could not carry out the send: its receive failed, for example on a
    /// deregistered region (`IBV_WC_REM_OP_ERR`).
    RemoteOperationError,
    /// The peer refused a one-sided write or read: the key is not in force on this
    /// connection, the range lies outside what it exposes, or it does not allow the access;
    /// nothing was touched (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// The peer could not be reached or gave up (`IBV_WC_RETRY_EXC_ERR`,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`). The software providers retry forever and never report
    /// it; the verbs provider does when the fabric fails.
    RetryExceeded,
    /// The request was not carried out because the connection closed or broke first
    /// (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
}

impl EndpointState {
    /// Refuses posting unless the connection is open, saying why.
    pub(crate) fn admits_posts(self) -> Result<(), PostError> {
        match self {
            EndpointState::Open => Ok(()),
            EndpointState::Closed => Err(PostError::Closed),
            EndpointState::PeerClosed => Err(PostError::PeerClosed),
            EndpointState::Broken => Err(PostError::ConnectionBroken),
        }
    }
}

impl CompletionStatus {
    /// Whether the request was carried out.
    pub fn is_success(self) -> bool {
        self == CompletionStatus::Success
    }
}

/// A completed work request (verbs `ibv_wc`).
///
/// ```
/// use tierbuf_transport::{Completion, CompletionStatus, Opcode};
/// let mut completions = [Completion::default(); 8];
/// assert_eq!(completions[0].status, CompletionStatus::Flushed);
/// completions[0] = Completion { wr_id: 7, byte_len: 64, status: CompletionStatus::Success, opcode: Opcode::Recv };
/// assert!(completions[0].status.is_success());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The id the request was posted with.
    pub wr_id: u64,
    /// For a successful receive or read, the bytes received or read, and for a receive
    /// consumed by a write with an immediate, the bytes written; otherwise 0.
    pub byte_len: u32,
    /// How the request ended.
    pub status: CompletionStatus,
    /// Which queue the request was on. A provider knows it even for failed requests
    /// (verbs leaves `opcode` undefined then; the verbs provider uses one completion queue
    /// per direction).
    pub opcode: Opcode,
}

impl Default for Completion {
    /// A placeholder for sizing a [`Endpoint::poll`] buffer: a flushed receive of id 0.
    fn default() -> Completion {
        Completion {
            wr_id: 0,
            byte_len: 0,
            status: CompletionStatus::Flushed,
            opcode: Opcode::Recv,
        }
    }
}
