//! The connection segment: the memory two processes share for one shared-memory
//! connection, and the lock-free protocol on it.
//!
//! One [`Direction`] carries messages from one side (the sender) to the other (the
//! receiver). Its ring holds the receiver's posted receive buffers; the sender fills them
//! in order and reports the result in the same ring entry. A message of at most
//! [`INLINE_CAPACITY`] bytes travels in the entry itself, on the cache lines of its result
//! word, and the receiver copies it into its buffer; a larger one the sender copies
//! straight into the receiver's buffer, which it has mapped.
//!
//! Each side polls only what the other writes for it: the sender reads `posted` (and
//! `announced` and `short_posted`) only when it has used up the receives it last saw
//! posted ([`PostedView`]); it reads an entry's buffer only for a message it copies into
//! that buffer, or for a short message where the view says the receive may be shorter
//! than [`INLINE_CAPACITY`], so an inline message's stores into the entry wait for no
//! load of a line the receiver wrote; and the receiver polls the result word of its
//! oldest entry, which the delivery writes last. So a message in steady flow costs the
//! receiver one cache line of the ring, and the sender none beyond the entries it fills.
//!
//! # Invariants
//!
//! - **One writer per word at a time.** `posted`, `announced`, `short_posted` and the
//!   buffer fields of an entry are written only by the receiver; `gate` is set and
//!   cleared by the sender and shut by the receiver, each by a read-modify-write; an
//!   entry's `byte_len` and `inline` words are written only by the sender, and its
//!   `filled` by the receiver (cleared, before the post that publishes the entry) and
//!   then by the sender (the result, after it saw that post); `state` by
//!   compare-and-swap from `OPEN` only, by either side. Every word is an atomic, so a peer that breaks the protocol can feed us
//!   wrong values but never a data race.
//! - **Posting publishes the entry.** The receiver writes its ring's entry for receive `n`
//!   (its buffer, and `filled` cleared), then stores `posted = n + 1` with `Release`; the
//!   sender reads `posted` with `Acquire` before it reads the entry. A [`PostedView`]
//!   remembers the last `posted` its sender read, so entries below it are read without
//!   reading `posted` again: that read already ordered them. Both sides look at a
//!   direction through a [`Ring`] of the same [`RingSize`] (the receiver's receive depth
//!   rounded up to a power of two), and the receiver has at most that many receives
//!   posted and not yet reaped, so it never rewrites an entry the sender may still read.
//! - **A short receive is marked before it is posted.** Posting receive `n` with a buffer
//!   shorter than [`INLINE_CAPACITY`], the receiver stores `short_posted = n + 1` before
//!   its `Release` of `posted`, and `short_posted` only grows. So a sender that read
//!   `posted = p` and then `short_posted = s` knows every receive in `s..p` holds at least
//!   `INLINE_CAPACITY` bytes (`PostedView::holds_inline`), and delivers a message that
//!   short into it inline without reading its buffer; it reads the buffer of any other
//!   receive, as before. A receiver that marks nothing fools only itself: it checks every
//!   delivery against its own record of the buffer it posted, inline ones too.
//! - **Delivering publishes the message.** The sender writes the message (into the
//!   entry's `inline` words, or into the receiver's buffer), then the entry's `byte_len`,
//!   then its `filled` with `Release`; the receiver reads `filled` with `Acquire` and takes
//!   the entry as delivered once it is not zero. So a receiver never sees a delivery (the
//!   tail of the message) without the whole message. It never takes an earlier lap's
//!   result for this one: it cleared `filled` itself before posting, and the sender's
//!   result comes after that post, so after the clear in the word's modification order.
//! - **Announcements come before the posts that need them.** The receiver sends a region's
//!   memory file on the bootstrap socket, then bumps `announced` (`Release`), then posts
//!   the receive naming it. A sender reads `announced` right after `posted` (both
//!   `Acquire`), so for every entry below that `posted` it has seen the bumps made before
//!   it, and drains the socket up to them before it looks the key up. A record sent on a
//!   Unix socket is in the receiver's queue when the send returns, so a socket drained
//!   short of the count proves the peer counted a record it never sent.
//! - **No delivery after shutting.** Each direction has a `gate` word with two bits: the
//!   sender sets `COPYING` with a compare-and-swap that fails if `SHUT` is set, and clears
//!   it (`Release`) after the delivery, copied or inline; the receiver sets `SHUT` with a
//!   fetch-or before it gives its posted buffers back (closing, or flushing a broken
//!   connection) and, if the fetch-or found `COPYING`, waits (`Acquire`) until it clears.
//!   Both are read-modify-writes of one word, so they are ordered: either the sender's
//!   swap comes first (and the receiver waits for the delivery, whose writes then happen
//!   before its wait ends, so it reaps it) or the receiver's (and the sender delivers
//!   nothing). So once the receiver has shut its gate, the peer writes none of its buffers
//!   again and no message is counted as sent by the one side and lost by the other.
//!   The gate word is on a line of the sender's own: passing it costs the sender no
//!   transfer between the cores. The wait is the caller's to bound (`keep_waiting`):
//!   the endpoint gives up on a peer that holds `COPYING` past its peer timeout, and on
//!   one whose socket closed. The ordering holds for an honest peer; a hostile one can
//!   write the receiver's announced memory whatever the gate says.
//! - **A parked receiver is woken by the delivery it missed.** A receiver about to sleep
//!   sets `PARKED` in the gate word of its incoming direction with a fetch-or, then looks
//!   at its oldest entry; every delivery ends with the sender's fetch-and that clears
//!   `COPYING` and `PARKED` together and tells whether `PARKED` was set, in which case
//!   the sender wakes the receiver (a record on the bootstrap socket). Both are
//!   read-modify-writes of one word: either the sender's comes later and sees `PARKED`
//!   (and wakes it), or it comes first, and then the receiver's fetch-or (`Acquire`)
//!   reads from it (`Release`), so the receiver's look finds the delivery and it does
//!   not sleep. No wake is lost; a wake may be spurious (the receiver found a delivery
//!   and the sender woke it too), which costs the receiver one empty look.

use crate::exposure::ExposureTable;
use crate::pair_state::StateWord;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Entries in each direction of the segment, so the deepest receive queue of a
/// shared-memory endpoint. A direction's ring uses as many of them as its receiver's
/// receive depth needs ([`RingSize`]).
pub const RING_CAPACITY: usize = 1024;

/// The segment as the provider lays it out in shared memory.
#[cfg(not(loom))]
pub(crate) type SharedSegment = Segment<RING_CAPACITY>;

/// Marks a segment of this layout: `"tierbuf"` and the layout version.
pub(crate) const SEGMENT_MAGIC: u64 = u64::from_be_bytes(*b"tierbuf\x05");

/// Words of message an entry carries inline.
const INLINE_WORDS: usize = 13;

/// The longest message a ring entry carries inline: the entry's two cache lines less its
/// other fields. A frame of a 64-byte payload and the connection's 16-byte header fits.
pub const INLINE_CAPACITY: usize = INLINE_WORDS * 8;

pub use crate::pair_state::PairState;

/// How the sender filled a posted receive, as written into its ring entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// The message was copied into the receiver's buffer; this many bytes.
    Delivered(u32),
    /// The message, this many bytes, is in the entry; the receiver copies it out
    /// ([`Ring::inline_message`]).
    Inline(u32),
    /// The message was longer than the buffer; nothing was written.
    TooLong,
    /// The sender could not reach the buffer (an unknown key or a buffer outside its
    /// region); nothing was written.
    Unreachable,
    /// The sender's one-sided write of this many bytes into an exposed range is done, and
    /// consumed the receive with this immediate.
    Written {
        /// The bytes written.
        len: u32,
        /// The write's immediate.
        imm: u32,
    },
}

/// A word of the segment that the peer wrote out of protocol, as the check that reads it
/// found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadWord {
    /// The receiver's `posted` count went back below what the sender had seen, or ran
    /// past the receives its ring can hold ([`Ring::is_posted`]).
    Posted {
        /// The value read.
        read: u64,
        /// The value the sender had seen before.
        seen: u64,
        /// The most it may be: the receives filled plus the ring's size.
        most: u64,
    },
}

impl std::fmt::Display for BadWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadWord::Posted { read, seen, most } => write!(
                f,
                "the ring's posted count read {read}, outside {seen}..={most} (it never goes \
                 back, and never passes the receives filled plus the ring's size)"
            ),
        }
    }
}

/// Gate bits: `COPYING` and `SHUT` order the sender's copies with the receiver's close;
/// `PARKED` asks the sender to wake the receiver at its next delivery.
const COPYING: u32 = 1;
const SHUT: u32 = 2;
const PARKED: u32 = 4;

const FILLED_DELIVERED: u32 = 1;
const FILLED_TOO_LONG: u32 = 2;
const FILLED_UNREACHABLE: u32 = 3;
const FILLED_INLINE: u32 = 4;
const FILLED_WRITTEN: u32 = 5;

/// A receive buffer as the receiver posts it: the region's remote key, the address of
/// the first byte and the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostedBuffer {
    /// The remote key of the receiver's region.
    pub remote_key: u32,
    /// The buffer's first byte in the receiver's address space.
    pub addr: u64,
    /// The buffer's length.
    pub len: u32,
}

/// The whole segment: magic, connection state, and one direction per side.
///
/// All zeroes is a valid empty segment, which is how a fresh memory file starts.
#[repr(C)]
#[derive(Debug)]
pub struct Segment<const N: usize> {
    magic: AtomicU64,
    state: StateWord,
    /// `directions[side]` carries messages from `side` to the other side.
    directions: [Direction<N>; 2],
    /// `exposures[side]`: the ranges `side` exposed to the other side (`exposure`).
    exposures: [ExposureTable; 2],
}

/// One direction of a connection.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct Direction<const N: usize> {
    /// Receives posted, ever (the receiver's ring tail).
    posted: AtomicU64,
    /// Region announcements sent on the bootstrap socket, ever.
    announced: AtomicU64,
    /// One more than the count of the latest receive posted with a buffer shorter than
    /// [`INLINE_CAPACITY`]; 0 while there was none.
    short_posted: AtomicU64,
    /// `COPYING` while the sender may write into the receiver's memory; `SHUT` once the
    /// receiver has taken its buffers back. On its own cache line: the sender changes it
    /// on every copy, and nothing the receiver polls sits beside it.
    gate: Padded<AtomicU32>,
    entries: [Entry; N],
}

/// What a sender has seen of the receiver's posts: the `posted` it last read and the
/// `announced` it read right after. Entries below `posted` are readable without another
/// look at the shared counters (module invariants).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostedView {
    posted: u64,
    announced: u64,
    short_posted: u64,
}

impl PostedView {
    /// The region announcements made before every post this view has seen.
    pub fn announced(&self) -> u64 {
        self.announced
    }

    /// Whether the `count`-th receive, which this view has seen posted, holds at least
    /// [`INLINE_CAPACITY`] bytes without a look at its buffer: no receive at or after it
    /// was marked short when the view was taken (module invariants). `false` means
    /// "read the buffer", not "short".
    pub fn holds_inline(&self, count: u64) -> bool {
        count >= self.short_posted
    }
}

/// A value on a cache line of its own.
#[repr(C, align(128))]
#[derive(Debug)]
struct Padded<T>(T);

/// One ring entry: two cache lines, the first holding the result word and the head of an
/// inline message, so a small message reaches the receiver with the result.
#[repr(C, align(128))]
#[derive(Debug)]
struct Entry {
    remote_key: AtomicU32,
    len: AtomicU32,
    addr: AtomicU64,
    filled: AtomicU32,
    byte_len: AtomicU32,
    inline: [AtomicU64; INLINE_WORDS],
}

impl Entry {
    /// Asks the core to move the entry's two lines out to the cache shared by all cores,
    /// where the receiver's next read finds them; the sender calls it once it has written
    /// a delivery. See [`demote`].
    fn demote(&self) {
        #[cfg(not(loom))]
        {
            let first = (self as *const Entry).cast::<u8>();
            demote(first);
            demote(first.wrapping_add(64));
        }
    }
}

// The entry is the two cache lines its documentation and `prefetch_inline_tail` assume.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Entry>() == 128);

impl<const N: usize> Segment<N> {
    /// An empty segment on the heap (the loom models' segment, and tests').
    pub fn new_boxed() -> Box<Segment<N>> {
        Box::new(Segment {
            magic: AtomicU64::new(SEGMENT_MAGIC),
            state: StateWord::new(),
            directions: [Direction::new(), Direction::new()],
            exposures: [ExposureTable::default(), ExposureTable::default()],
        })
    }

    /// Stamps a zeroed segment as this layout's.
    #[cfg(not(loom))]
    pub(crate) fn stamp(&self) {
        self.magic.store(SEGMENT_MAGIC, Ordering::Release);
    }

    /// Whether the segment carries this layout's stamp.
    #[cfg(not(loom))]
    pub(crate) fn is_stamped(&self) -> bool {
        self.magic.load(Ordering::Acquire) == SEGMENT_MAGIC
    }

    /// The ranges `side` exposed to the other side.
    pub fn exposures(&self, side: usize) -> &ExposureTable {
        &self.exposures[side]
    }

    /// Ends a copy [`Segment::begin_copy`] admitted that delivers nothing into a ring
    /// entry (a one-sided write without an immediate, or a read): reopens the gate.
    pub fn end_copy(&self, side: usize) {
        self.directions[side]
            .gate
            .0
            .fetch_and(!COPYING, Ordering::Release);
    }

    /// The direction carrying messages from `side`.
    pub fn direction(&self, side: usize) -> &Direction<N> {
        &self.directions[side]
    }

    /// The direction carrying messages from `side`, through a ring of `size`.
    pub fn ring(&self, side: usize, size: RingSize) -> Ring<'_, N> {
        Ring {
            direction: &self.directions[side],
            size,
        }
    }

    /// The connection state.
    pub fn state(&self) -> PairState {
        self.state.load()
    }

    /// Moves an open connection to closed by `side`; a connection already closed or
    /// broken keeps its first reason.
    pub fn close(&self, side: usize) {
        self.state.close(side);
    }

    /// Moves an open connection to broken.
    pub fn break_connection(&self) {
        self.state.break_connection();
    }

    /// The sender's step before it writes into the receiver's memory on the direction
    /// from `side`: passes the gate unless the receiver has shut it (or the connection is
    /// down). `true` means copy, then call [`Ring::deliver`], which reopens the gate.
    pub fn begin_copy(&self, side: usize) -> bool {
        if !self.state.is_open() {
            return false;
        }
        let gate = &self.directions[side].gate.0;
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ShmCopyGateCheckThenSet,
        ) {
            if gate.load(Ordering::Acquire) & SHUT != 0 {
                return false;
            }
            gate.store(COPYING, Ordering::Relaxed);
            return true;
        }
        gate.fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
            (bits & SHUT == 0).then_some(bits | COPYING)
        })
        .is_ok()
    }

    /// The receiver's step before it takes back the buffers it posted (closing, or
    /// flushing a broken connection): shuts the gate of the direction towards `side` and,
    /// if the sender is copying, waits until it is done. `keep_waiting` is asked between
    /// looks (it says whether the peer may still be alive and within its deadline); a
    /// `false` ends the wait.
    pub fn shut_incoming(&self, side: usize, mut keep_waiting: impl FnMut() -> bool) {
        let gate = &self.directions[1 - side].gate.0;
        let mut bits = gate.fetch_or(SHUT, Ordering::AcqRel);
        while bits & COPYING != 0 {
            if !keep_waiting() {
                return;
            }
            crate::sync::yield_now();
            bits = gate.load(Ordering::Acquire);
        }
    }
}

impl<const N: usize> Segment<N> {
    /// The receiver's step before it sleeps, on `side`'s incoming direction: asks the
    /// sender to wake it at its next delivery. Look for a delivery after it (module
    /// invariants); a receiver that finds one, or wakes, calls
    /// [`Segment::unpark_incoming`].
    pub fn park_incoming(&self, side: usize) {
        self.directions[1 - side]
            .gate
            .0
            .fetch_or(PARKED, Ordering::AcqRel);
    }

    /// Withdraws `side`'s request to be woken, if the sender has not taken it yet.
    pub fn unpark_incoming(&self, side: usize) {
        self.directions[1 - side]
            .gate
            .0
            .fetch_and(!PARKED, Ordering::Relaxed);
    }
}

impl<const N: usize> Direction<N> {
    fn new() -> Direction<N> {
        Direction {
            posted: AtomicU64::new(0),
            announced: AtomicU64::new(0),
            short_posted: AtomicU64::new(0),
            gate: Padded(AtomicU32::new(0)),
            entries: std::array::from_fn(|_| Entry {
                remote_key: AtomicU32::new(0),
                len: AtomicU32::new(0),
                addr: AtomicU64::new(0),
                filled: AtomicU32::new(0),
                byte_len: AtomicU32::new(0),
                inline: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }

    /// The region announcements the receiver counted as sent: read (`Acquire`) after the
    /// read of a word it published later, such as an exposure's, it covers every
    /// announcement made before that publication.
    pub fn announced(&self) -> u64 {
        self.announced.load(Ordering::Acquire)
    }

    /// The receiver's record that it sent one more region announcement.
    #[cfg(not(loom))]
    pub(crate) fn announce(&self) {
        self.announced.fetch_add(1, Ordering::Release);
    }
}

/// How many entries of a direction its ring uses: the receiver's receive depth rounded
/// up to a power of two, which both sides know from the handshake. Entries past it are
/// never touched, so their pages of the segment's memory file are never allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSize {
    /// The size less one; the size is a power of two.
    mask: u64,
}

impl RingSize {
    /// The ring of a receiver that keeps at most `depth` receives outstanding (at least
    /// one entry).
    pub const fn of_depth(depth: u32) -> RingSize {
        let depth = if depth == 0 { 1 } else { depth as u64 };
        RingSize {
            mask: depth.next_power_of_two() - 1,
        }
    }

    /// Entries in the ring.
    pub fn entries(self) -> u64 {
        self.mask + 1
    }
}

/// One direction seen through its ring: the posts, deliveries and results of the
/// direction's protocol (module documentation). Both sides look at a direction through a
/// ring of the same size.
#[derive(Debug, Clone, Copy)]
pub struct Ring<'s, const N: usize> {
    direction: &'s Direction<N>,
    size: RingSize,
}

impl<'s, const N: usize> Ring<'s, N> {
    /// The entry of the `count`-th receive (counting from 0). The `% N` keeps a ring
    /// sized past the segment (which `RingSize::of_depth` never makes for a depth the
    /// provider accepts) inside the entries.
    fn entry(&self, count: u64) -> &'s Entry {
        &self.direction.entries[((count & self.size.mask) as usize) % N]
    }

    /// The receiver's post of its `count`-th receive (counting from 0): writes the
    /// entry and clears its result, then publishes it. The caller has fewer receives
    /// posted and not reaped than the ring's size.
    pub fn post(&self, count: u64, buffer: PostedBuffer) {
        let entry = self.entry(count);
        entry.remote_key.store(buffer.remote_key, Ordering::Relaxed);
        entry.addr.store(buffer.addr, Ordering::Relaxed);
        entry.len.store(buffer.len, Ordering::Relaxed);
        let short = (buffer.len as usize) < INLINE_CAPACITY;
        #[cfg(loom)]
        if short
            && tierbuf_pool::sync::planted::is_planted(
                tierbuf_pool::sync::planted::Bug::ShmShortMarkedAfterPost,
            )
        {
            entry.filled.store(0, Ordering::Relaxed);
            self.direction.posted.store(count + 1, publication());
            self.direction
                .short_posted
                .store(count + 1, Ordering::Relaxed);
            return;
        }
        if short {
            self.direction
                .short_posted
                .store(count + 1, Ordering::Relaxed);
        }
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ShmClearResultAfterPost,
        ) {
            self.direction.posted.store(count + 1, publication());
            entry.filled.store(0, Ordering::Relaxed);
            return;
        }
        entry.filled.store(0, Ordering::Relaxed);
        self.direction.posted.store(count + 1, publication());
    }

    /// Whether the receiver has posted its `count`-th receive, where `count` is the
    /// number of receives the sender has filled. Reads the shared counters (into `view`)
    /// only when `count` is past what `view` has seen; a sender passes the same view every
    /// time.
    ///
    /// `posted` is the peer's word, so it is checked before use: it never goes back, and
    /// it never runs more than the ring's size past `count` (the receiver reaps only what
    /// the sender filled, and has at most the ring's size of receives posted and not
    /// reaped). A value outside that is [`BadWord::Posted`] and `view` keeps what it had,
    /// so no entry the receiver never posted is ever filled or counted as sent.
    pub fn is_posted(&self, count: u64, view: &mut PostedView) -> Result<bool, BadWord> {
        if count >= view.posted {
            let posted = self.direction.posted.load(Ordering::Acquire);
            let most = count.saturating_add(self.size.entries());
            if posted < view.posted || posted > most {
                return Err(BadWord::Posted {
                    read: posted,
                    seen: view.posted,
                    most,
                });
            }
            view.posted = posted;
            view.announced = self.direction.announced.load(Ordering::Acquire);
            // Stored before the `posted` just read, whose `Acquire` orders it (module
            // invariants); a later value only marks more receives short.
            view.short_posted = self.direction.short_posted.load(Ordering::Relaxed);
        }
        Ok(count < view.posted)
    }

    /// The buffer of the `count`-th receive, which the sender has seen posted
    /// ([`Ring::is_posted`]).
    pub fn posted_buffer(&self, count: u64) -> PostedBuffer {
        let entry = self.entry(count);
        PostedBuffer {
            remote_key: entry.remote_key.load(Ordering::Relaxed),
            addr: entry.addr.load(Ordering::Relaxed),
            len: entry.len.load(Ordering::Relaxed),
        }
    }

    /// The buffer of the `count`-th receive if the receiver has posted it:
    /// [`Ring::is_posted`], then [`Ring::posted_buffer`].
    pub fn posted(
        &self,
        count: u64,
        view: &mut PostedView,
    ) -> Result<Option<PostedBuffer>, BadWord> {
        Ok(self
            .is_posted(count, view)?
            .then(|| self.posted_buffer(count)))
    }

    /// The sender's report on the `count`-th posted receive: writes the result, which
    /// publishes the delivery (and so the message copied before), then reopens the gate.
    /// Returns whether the receiver had parked ([`Segment::park_incoming`]): the sender
    /// must then wake it.
    ///
    /// # Panics
    ///
    /// On [`Filled::Inline`]: an inline message goes through [`Ring::deliver_inline`].
    #[must_use = "a parked receiver must be woken"]
    pub fn deliver(&self, count: u64, filled: Filled) -> bool {
        let entry = self.entry(count);
        let (code, byte_len) = match filled {
            Filled::Delivered(byte_len) => (FILLED_DELIVERED, byte_len),
            Filled::Inline(_) => panic!("an inline message is delivered by `deliver_inline`"),
            Filled::TooLong => (FILLED_TOO_LONG, 0),
            Filled::Unreachable => (FILLED_UNREACHABLE, 0),
            Filled::Written { len, imm } => {
                entry.inline[0].store(u64::from(imm), Ordering::Relaxed);
                (FILLED_WRITTEN, len)
            }
        };
        self.publish(entry, code, byte_len)
    }

    /// The sender's delivery of the message `parts` make laid end to end (at most
    /// [`INLINE_CAPACITY`] bytes) in the `count`-th posted receive's entry, which it must
    /// have seen posted, after it passed the gate ([`Segment::begin_copy`]): writes the
    /// message and its length, then the result, which publishes them, then reopens the
    /// gate.
    ///
    /// The words go in from the last: the tail on the entry's second cache line, then
    /// the first line's words and the result back to back, so the receiver's polls of the
    /// first line do not take it away between the sender's stores to it. Each word is
    /// read straight from the part it lies in and stored (a part that starts on a word
    /// boundary is stored word by word; a word that spans parts is gathered by `word_at`):
    /// no copy of the
    /// message stands between the sender's bytes and the entry, so the stores wait for
    /// nothing but those bytes (`docs/transport.md`, "What the 64 B round trip is made
    /// of").
    ///
    /// Returns whether the receiver had parked, as [`Ring::deliver`] does.
    ///
    /// # Panics
    ///
    /// If the message is longer than [`INLINE_CAPACITY`].
    #[must_use = "a parked receiver must be woken"]
    pub fn deliver_inline(&self, count: u64, parts: &[&[u8]]) -> bool {
        let entry = self.entry(count);
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let carried = len.div_ceil(8);
        assert!(
            carried <= INLINE_WORDS,
            "an inline message past its capacity"
        );
        if parts.iter().rev().skip(1).all(|part| part.len() % 8 == 0) {
            // Every part starts on a word of the message (a connection's frame: a header
            // of whole words, then the payload): each word is a load from one part.
            let mut end = len;
            for part in parts.iter().rev() {
                end -= part.len();
                store_words_from_last(&entry.inline[end / 8..], part);
            }
        } else {
            for (index, word) in entry.inline[..carried].iter().enumerate().rev() {
                word.store(word_at(parts, index * 8), Ordering::Relaxed);
            }
        }
        self.publish(entry, FILLED_INLINE, len as u32)
    }

    /// Writes `entry`'s length, then its result word, which publishes the delivery, then
    /// hands the entry's lines on towards the receiver ([`Entry::demote`]) and reopens
    /// the gate, taking the receiver's request to be woken with it (module invariants).
    /// Returns whether there was one.
    fn publish(&self, entry: &Entry, code: u32, byte_len: u32) -> bool {
        let gate = &self.direction.gate.0;
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ShmWakeLookedAtBeforePublish,
        ) {
            let parked = gate.load(Ordering::Acquire) & PARKED != 0;
            entry.byte_len.store(byte_len, Ordering::Relaxed);
            entry.filled.store(code, publication());
            gate.fetch_and(!(COPYING | PARKED), Ordering::Release);
            return parked;
        }
        entry.byte_len.store(byte_len, Ordering::Relaxed);
        entry.filled.store(code, publication());
        entry.demote();
        gate.fetch_and(!(COPYING | PARKED), Ordering::Release) & PARKED != 0
    }

    /// The inline message of the receiver's `count`-th receive, into `out` (as long as
    /// the message): call it once [`Ring::delivered`] reported
    /// [`Filled::Inline`], which ordered the sender's writes before these reads. Each
    /// word goes straight into `out` as it is read, the last one cut to the message's
    /// length.
    ///
    /// # Panics
    ///
    /// If `out` is longer than [`INLINE_CAPACITY`].
    pub fn inline_message(&self, count: u64, out: &mut [u8]) {
        let entry = self.entry(count);
        assert!(
            out.len().div_ceil(8) <= INLINE_WORDS,
            "an inline message past its capacity"
        );
        let mut whole = out.chunks_exact_mut(8);
        let mut words = entry.inline.iter();
        for (bytes, word) in whole.by_ref().zip(words.by_ref()) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = whole.into_remainder();
        if !tail.is_empty() {
            let word = words
                .next()
                .expect("the length check leaves a word for the tail")
                .load(Ordering::Relaxed);
            tail.copy_from_slice(&word.to_ne_bytes()[..tail.len()]);
        }
    }

    /// Asks the core to fetch the second cache line of the `count`-th entry, which holds
    /// the tail of an inline message, while the receiver polls the first: see
    /// [`prefetch`].
    #[cfg(not(loom))]
    pub(crate) fn prefetch_inline_tail(&self, count: u64) {
        let entry: *const Entry = self.entry(count);
        prefetch(entry.cast::<u8>().wrapping_add(64));
    }

    /// The receiver's look at the result of its `count`-th receive, once delivered; the
    /// receive must be posted and not yet reaped. `Err` carries a result code this layout
    /// does not know: the peer broke the protocol.
    pub fn delivered(&self, count: u64) -> Option<Result<Filled, u32>> {
        let entry = self.entry(count);
        Some(match entry.filled.load(Ordering::Acquire) {
            0 => return None,
            FILLED_DELIVERED => Ok(Filled::Delivered(entry.byte_len.load(Ordering::Relaxed))),
            FILLED_INLINE => Ok(Filled::Inline(entry.byte_len.load(Ordering::Relaxed))),
            FILLED_TOO_LONG => Ok(Filled::TooLong),
            FILLED_UNREACHABLE => Ok(Filled::Unreachable),
            FILLED_WRITTEN => Ok(Filled::Written {
                len: entry.byte_len.load(Ordering::Relaxed),
                // The immediate is the low half of the word; a peer that sets the high
                // half changes nothing this side reads.
                imm: entry.inline[0].load(Ordering::Relaxed) as u32,
            }),
            unknown => Err(unknown),
        })
    }
}

/// Stores `bytes` into the first of `words`, eight bytes a word and the last padded with
/// zeroes, from the last word to the first (the order [`Ring::deliver_inline`] keeps).
fn store_words_from_last(words: &[AtomicU64], bytes: &[u8]) {
    let (whole, tail) = bytes.as_chunks::<8>();
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        words[whole.len()].store(u64::from_ne_bytes(last), Ordering::Relaxed);
    }
    for (word, chunk) in words.iter().zip(whole).rev() {
        word.store(u64::from_ne_bytes(*chunk), Ordering::Relaxed);
    }
}

/// The eight bytes from offset `at` of the message `parts` make laid end to end, padded
/// with zeroes past its end: one unaligned load when the word lies inside one part (a
/// connection's frame header and payload are whole words of the message), the bytes
/// gathered from the parts it spans otherwise.
fn word_at(parts: &[&[u8]], at: usize) -> u64 {
    let mut start = 0;
    for (index, part) in parts.iter().enumerate() {
        if at < start + part.len() {
            let offset = at - start;
            if let Some(bytes) = part.get(offset..offset + 8) {
                return u64::from_ne_bytes(bytes.try_into().expect("eight bytes"));
            }
            let mut bytes = [0u8; 8];
            let mut filled = 0;
            let spanned =
                std::iter::once(&part[offset..]).chain(parts[index + 1..].iter().copied());
            for piece in spanned {
                let take = (8 - filled).min(piece.len());
                bytes[filled..filled + take].copy_from_slice(&piece[..take]);
                filled += take;
                if filled == 8 {
                    break;
                }
            }
            return u64::from_ne_bytes(bytes);
        }
        start += part.len();
    }
    0
}

/// Asks the core to fetch the cache line at `address` ahead of a read. A prefetch reads
/// nothing the program sees and cannot fault, so any address will do and it needs no
/// ordering with the peer's writes; where the target has no prefetch, it does nothing.
#[cfg(not(loom))]
#[inline]
pub(crate) fn prefetch(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sse` is part of every x86_64 target, and a prefetch of any address neither
    // reads program-visible memory nor faults.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Asks the core to move the cache line at `address` from its own caches to the cache all
/// cores share (`cldemote`), so that another core's next read of it is served from there
/// rather than by a snoop of this core: a producer's hint for its consumer. Like a
/// prefetch it reads and writes nothing the program sees and cannot fault; a core without
/// the instruction runs it as a no-op (its encoding lies in the reserved no-op space), and
/// where the target has no such hint, it does nothing.
///
/// The sender demotes the entry it has just delivered into, so that the receiver's next
/// read of it is served from the shared cache instead of a snoop of the sender's core;
/// the receiver does not demote the entry it has read, which made the round trip slower
/// rather than faster. With rings sized by the queue depth the entries are reused
/// sooner, while the other core still holds them, and the demotion makes up most of that
/// (`docs/transport.md`, "Data path"). The bench that decides it is the connection's 64 B
/// `transport/pingpong/shm` (`benches/benches/transport.rs`), run with and without the
/// demotion.
#[cfg(not(loom))]
#[inline]
fn demote(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `cldemote` is a hint: it neither reads nor writes program-visible memory,
    // cannot fault, and is a no-op on cores that lack it; it touches no register but its
    // address operand and keeps the flags and the stack.
    unsafe {
        std::arch::asm!(
            "cldemote [{address}]",
            address = in(reg) address,
            options(nostack, preserves_flags, readonly),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// The ordering of the stores that publish an entry or a delivery.
fn publication() -> Ordering {
    #[cfg(loom)]
    if tierbuf_pool::sync::planted::is_planted(tierbuf_pool::sync::planted::Bug::ShmPublishRelaxed)
    {
        return Ordering::Relaxed;
    }
    Ordering::Release
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const BUFFER: PostedBuffer = PostedBuffer {
        remote_key: 7,
        addr: 0x1000,
        len: 64,
    };

    #[test]
    fn zeroed_memory_is_an_open_empty_segment() {
        let layout = std::alloc::Layout::new::<SharedSegment>();
        // SAFETY: a zeroed allocation of the segment's layout, freed below; every field is
        // an atomic integer, for which all zeroes is a valid value.
        unsafe {
            let raw = std::alloc::alloc_zeroed(layout).cast::<SharedSegment>();
            assert!(!raw.is_null());
            let segment = &*raw;
            assert!(!segment.is_stamped());
            segment.stamp();
            assert!(segment.is_stamped());
            assert_eq!(segment.state(), PairState::Open);
            assert_eq!(
                segment
                    .ring(0, RingSize::of_depth(1024))
                    .posted(0, &mut PostedView::default()),
                Ok(None)
            );
            assert_eq!(segment.ring(1, RingSize::of_depth(1024)).delivered(0), None);
            std::alloc::dealloc(raw.cast(), layout);
        }
    }

    /// A sender skips reading the buffers of the receives its view shows long, and only
    /// those: the receives after the last one posted shorter than an inline message.
    #[test]
    fn only_receives_after_the_last_short_one_are_shown_to_hold_an_inline_message() {
        let segment = Segment::<8>::new_boxed();
        let ring = segment.ring(0, RingSize::of_depth(8));
        let long = PostedBuffer {
            len: INLINE_CAPACITY as u32,
            ..BUFFER
        };
        let short = PostedBuffer {
            len: INLINE_CAPACITY as u32 - 1,
            ..BUFFER
        };
        let mut view = PostedView::default();
        ring.post(0, long);
        assert_eq!(ring.is_posted(0, &mut view), Ok(true));
        assert!(view.holds_inline(0), "no short receive yet");
        ring.post(1, long);
        ring.post(2, short);
        ring.post(3, long);
        assert_eq!(
            ring.is_posted(1, &mut view),
            Ok(true),
            "the view is refreshed past 0"
        );
        assert_eq!(
            [1, 2, 3].map(|count| view.holds_inline(count)),
            [false, false, true],
            "before the short receive the view cannot tell; at it, short; after it, long"
        );
        assert_eq!(ring.posted_buffer(2), short);
        ring.post(4, long);
        assert_eq!(ring.is_posted(4, &mut view), Ok(true));
        assert!(view.holds_inline(4), "a long receive after the short one");
    }

    #[test]
    fn a_post_is_seen_once_published_and_its_result_once_delivered() {
        let segment = Segment::<4>::new_boxed();
        let direction = segment.ring(0, RingSize::of_depth(4));
        let mut view = PostedView::default();
        for count in 0..10 {
            assert_eq!(direction.posted(count, &mut view), Ok(None));
            direction.post(
                count,
                PostedBuffer {
                    len: count as u32,
                    ..BUFFER
                },
            );
            assert_eq!(
                direction.posted(count, &mut view).map(|b| b.map(|b| b.len)),
                Ok(Some(count as u32))
            );
            assert_eq!(direction.delivered(count), None);
            assert!(segment.begin_copy(0));
            assert!(
                !direction.deliver(count, Filled::Delivered(count as u32)),
                "nobody parked"
            );
            assert_eq!(
                direction.delivered(count),
                Some(Ok(Filled::Delivered(count as u32)))
            );
        }
        direction.post(10, BUFFER);
        assert!(!direction.deliver(10, Filled::TooLong), "nobody parked");
        assert_eq!(direction.delivered(10), Some(Ok(Filled::TooLong)));
    }

    #[test]
    fn a_view_reads_the_counters_only_past_what_it_saw() {
        let segment = Segment::<4>::new_boxed();
        let direction = segment.ring(0, RingSize::of_depth(4));
        segment.direction(0).announce();
        for count in 0..3 {
            direction.post(count, BUFFER);
        }
        let mut view = PostedView::default();
        assert_eq!(direction.posted(0, &mut view), Ok(Some(BUFFER)));
        assert_eq!(
            view,
            PostedView {
                posted: 3,
                announced: 1,
                // BUFFER is shorter than an inline message.
                short_posted: 3,
            }
        );
        segment.direction(0).announce();
        direction.post(3, BUFFER);
        assert_eq!(direction.posted(2, &mut view), Ok(Some(BUFFER)));
        assert_eq!(view.announced(), 1, "entries below 3 need no new look");
        assert_eq!(direction.posted(3, &mut view), Ok(Some(BUFFER)));
        assert_eq!(view.announced(), 2, "entry 3 made the view look again");
        assert_eq!(direction.posted(4, &mut view), Ok(None));
    }

    /// The peer's `posted` word is bounded before the sender uses it: a count that runs
    /// past the ring's size beyond the receives filled, or goes back, is the peer's
    /// violation, and the view keeps what it had, so no entry the peer never posted is
    /// filled.
    #[test]
    fn a_posted_count_past_the_ring_or_going_back_is_refused() {
        let segment = Segment::<8>::new_boxed();
        let ring = segment.ring(0, RingSize::of_depth(4));
        let posted = &segment.direction(0).posted;
        let mut view = PostedView::default();
        posted.store(4, Ordering::Release);
        assert_eq!(
            ring.is_posted(0, &mut view),
            Ok(true),
            "a full ring is in bounds"
        );
        posted.store(5, Ordering::Release);
        assert_eq!(
            ring.is_posted(4, &mut view),
            Ok(true),
            "four filled, five posted"
        );
        posted.store(1 << 40, Ordering::Release);
        assert_eq!(
            ring.is_posted(5, &mut view),
            Err(BadWord::Posted {
                read: 1 << 40,
                seen: 5,
                most: 9
            })
        );
        assert_eq!(view.posted, 5, "the view keeps what it had");
        posted.store(3, Ordering::Release);
        assert!(matches!(
            ring.is_posted(5, &mut view),
            Err(BadWord::Posted { read: 3, .. })
        ));
    }

    #[test]
    fn a_ring_uses_only_the_entries_of_its_size() {
        assert_eq!(RingSize::of_depth(1).entries(), 1);
        assert_eq!(RingSize::of_depth(5).entries(), 8);
        assert_eq!(RingSize::of_depth(64).entries(), 64);
        let segment = Segment::<8>::new_boxed();
        let ring = segment.ring(0, RingSize::of_depth(3));
        for count in 0..12 {
            ring.post(count, BUFFER);
            assert!(
                !ring.deliver(count, Filled::Delivered(count as u32)),
                "nobody parked"
            );
            assert_eq!(
                ring.delivered(count),
                Some(Ok(Filled::Delivered(count as u32)))
            );
        }
        // Receives 0..12 went round entries 0..4 only; the rest were never written.
        let whole = segment.ring(0, RingSize::of_depth(8));
        for count in 4..8 {
            assert_eq!(whole.delivered(count), None, "entry {count}");
        }
        assert_eq!(
            whole.delivered(3),
            Some(Ok(Filled::Delivered(11))),
            "receive 11 in entry 3"
        );
    }

    #[test]
    fn a_reused_entry_is_not_taken_for_its_earlier_lap() {
        let segment = Segment::<1>::new_boxed();
        let direction = segment.ring(0, RingSize::of_depth(1));
        direction.post(0, BUFFER);
        assert!(!direction.deliver(0, Filled::Delivered(5)), "nobody parked");
        assert_eq!(direction.delivered(0), Some(Ok(Filled::Delivered(5))));
        direction.post(1, BUFFER);
        assert_eq!(direction.delivered(1), None, "lap 0's result is cleared");
        assert!(!direction.deliver(1, Filled::Delivered(6)), "nobody parked");
        assert_eq!(direction.delivered(1), Some(Ok(Filled::Delivered(6))));
    }

    #[test]
    fn inline_messages_of_every_length_come_out_as_they_went_in() {
        let segment = Segment::<1>::new_boxed();
        let sent: Vec<u8> = (1..=INLINE_CAPACITY as u8).collect();
        for (lap, len) in (0u64..).zip(0..=INLINE_CAPACITY) {
            let received = deliver_inline_and_read(&segment, lap, &[&sent[..len]]);
            assert_eq!(received, sent[..len], "lap {lap}");
        }
    }

    #[test]
    fn a_message_split_anywhere_into_parts_comes_out_whole() {
        let segment = Segment::<1>::new_boxed();
        let sent: Vec<u8> = (1..=INLINE_CAPACITY as u8).collect();
        let mut lap = 0;
        for len in [0, 1, 7, 8, 9, 80, INLINE_CAPACITY] {
            for first in 0..=len {
                for second in first..=len {
                    let parts = [
                        &sent[..first],
                        &[][..],
                        &sent[first..second],
                        &sent[second..len],
                    ];
                    let received = deliver_inline_and_read(&segment, lap, &parts);
                    assert_eq!(received, sent[..len], "split at {first} and {second}");
                    lap += 1;
                }
            }
        }
    }

    /// Posts receive `lap` on a ring of one entry, delivers `parts` inline into it, checks
    /// the reported length and returns the message the receiver reads.
    fn deliver_inline_and_read(segment: &Segment<1>, lap: u64, parts: &[&[u8]]) -> Vec<u8> {
        let direction = segment.ring(0, RingSize::of_depth(1));
        let len: usize = parts.iter().map(|part| part.len()).sum();
        direction.post(lap, BUFFER);
        assert!(segment.begin_copy(0));
        assert!(!direction.deliver_inline(lap, parts), "nobody parked");
        assert_eq!(
            direction.delivered(lap),
            Some(Ok(Filled::Inline(len as u32)))
        );
        let mut received = vec![0u8; len];
        direction.inline_message(lap, &mut received);
        received
    }

    #[test]
    fn a_word_past_the_message_is_padded_with_zeroes() {
        assert_eq!(
            word_at(&[b"abc", b"de"], 0),
            u64::from_ne_bytes(*b"abcde\0\0\0")
        );
        assert_eq!(
            word_at(&[b"abcdefgh", b"ij"], 8),
            u64::from_ne_bytes(*b"ij\0\0\0\0\0\0")
        );
        assert_eq!(word_at(&[b"abcdefgh"], 8), 0);
    }

    #[test]
    #[should_panic(expected = "past its capacity")]
    fn an_inline_message_past_the_capacity_is_refused() {
        let segment = Segment::<1>::new_boxed();
        segment.ring(0, RingSize::of_depth(1)).post(0, BUFFER);
        assert!(segment.begin_copy(0));
        let _parked = segment
            .ring(0, RingSize::of_depth(1))
            .deliver_inline(0, &[&[0u8; INLINE_CAPACITY], &[0]]);
    }

    #[test]
    fn closing_stops_copies_and_keeps_the_first_reason() {
        let segment = Segment::<4>::new_boxed();
        segment.close(1);
        segment.break_connection();
        segment.close(0);
        assert_eq!(segment.state(), PairState::ClosedBy(1));
        assert!(!segment.begin_copy(0));
        let mut asked = 0;
        segment.shut_incoming(1, || {
            asked += 1;
            true
        });
        assert_eq!(asked, 0, "nobody is copying, so the closer does not wait");
    }

    #[test]
    fn a_shut_gate_stops_the_sender_even_while_the_connection_is_open() {
        let segment = Segment::<4>::new_boxed();
        assert!(segment.begin_copy(0));
        let parked = segment
            .ring(0, RingSize::of_depth(4))
            .deliver(0, Filled::Delivered(0));
        assert!(!parked);
        segment.shut_incoming(1, || unreachable!("the copy is done"));
        assert_eq!(segment.state(), PairState::Open);
        assert!(!segment.begin_copy(0), "the gate is shut");
        assert!(segment.begin_copy(1), "the other direction's gate is open");
    }

    #[test]
    fn a_delivery_reports_a_parked_receiver_once_and_unparking_withdraws_the_request() {
        let segment = Segment::<4>::new_boxed();
        let ring = segment.ring(0, RingSize::of_depth(4));
        for count in 0..3 {
            ring.post(count, BUFFER);
        }
        segment.park_incoming(1);
        segment.park_incoming(0); // the other direction's request is not this one's
        assert!(segment.begin_copy(0));
        assert!(ring.deliver(0, Filled::Delivered(1)), "the receiver parked");
        assert!(segment.begin_copy(0));
        assert!(
            !ring.deliver(1, Filled::Delivered(1)),
            "the wake took the request"
        );
        segment.park_incoming(1);
        segment.unpark_incoming(1);
        assert!(segment.begin_copy(0));
        assert!(
            !ring.deliver(2, Filled::Delivered(1)),
            "the request was withdrawn"
        );
    }

    #[test]
    fn an_unknown_result_code_is_reported_as_such() {
        let segment = Segment::<4>::new_boxed();
        let direction = segment.ring(1, RingSize::of_depth(4));
        direction.post(0, BUFFER);
        direction.entry(0).filled.store(99, Ordering::Release);
        assert_eq!(direction.delivered(0), Some(Err(99)));
    }
}
