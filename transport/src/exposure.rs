//! Exposures: ranges of one side's registered memory that the connection's peer may write
//! or read one-sidedly ([`Endpoint::expose`](crate::Endpoint::expose)), and the lock-free
//! protocol by which a revocation waits out the peer's access in flight.
//!
//! Each side of a software connection owns an `ExposureTable` of [`EXPOSURE_SLOTS`]
//! slots that it writes and its peer reads: the loopback provider keeps the two tables in
//! the pair's shared state, the shm provider in the connection segment both processes map.
//! A slot holds one exposure: its key, what the peer may do, and where the range lies
//! (the region's remote key, the address of its first byte, its length). The key is what
//! the peer is told ([`RemoteBuffer::key`](crate::RemoteBuffer)): its low bits are the
//! slot, its high bits a serial drawn from the provider (`KeySerial`), so a key is
//! unique among all the provider's connections (until the 26-bit serial wraps), and a key
//! given on one connection names nothing on another, nor on its own after revocation.
//!
//! # Invariants
//!
//! - **One writer per word at a time.** The owner alone writes a slot's `addr`, `len` and
//!   `region_key`, and only while the slot is free; the slot's `word` (key, access, `LIVE`,
//!   `ACCESSING`) is set and cleared by the owner and marked `ACCESSING` and unmarked by the
//!   peer, each with a read-modify-write or a store the other side's read-modify-write
//!   cannot race (the owner's stores happen only while the slot is free or revoked and not
//!   accessed).
//! - **Exposing publishes the slot.** The owner writes the range, then stores the word
//!   with the key and `LIVE` (`Release`); the peer's compare-and-swap that marks
//!   `ACCESSING` reads it (`Acquire`), so the range it then reads is the one exposed.
//! - **No access after revocation.** The peer marks `ACCESSING` with a compare-and-swap
//!   that fails unless the word holds the key it names, `LIVE` and the access it needs;
//!   the owner revokes with a fetch-and that clears `LIVE`, then waits (`Acquire`) until
//!   `ACCESSING` clears, which the peer does (`Release`) after its copy. Both are
//!   read-modify-writes of one word, so they are ordered: either the peer's comes first
//!   (and the owner waits for the copy, whose bytes are then written before the wait
//!   ends) or the owner's (and the peer copies nothing). So once `revoke` returns, an
//!   honest peer touches no byte of the range again. The wait is the caller's to bound
//!   (`keep_waiting`), as for the shm copy gate: a hostile shm peer can hold `ACCESSING`
//!   for good, and can write any memory announced to it whatever the slot says.
//! - **The owner trusts nothing it reads back.** It keeps its own record of each slot
//!   (which it uses, and which holds the region) and reads the shared word only to wait
//!   for `ACCESSING` to clear.
//!
//! Model: `loom-tests/src/transport_models.rs`, `revocation_waits_out_an_access`, with the
//! planted bug `ExposureRevokeWithoutWait`.

use tierbuf_pool::Region;

use crate::error::PostError;
use crate::provider::{BufferRef, RemoteBuffer};
use crate::registry::Resolved;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Exposures one side of a connection holds at once.
pub const EXPOSURE_SLOTS: usize = 64;

/// Bits of a key that name the slot.
const SLOT_BITS: u32 = EXPOSURE_SLOTS.trailing_zeros();

/// The word of a free slot.
const FREE: u64 = 0;
/// The exposure is in force.
const LIVE: u64 = 1;
/// The peer is copying to or from the range.
const ACCESSING: u64 = 2;
/// The peer may write the range.
const WRITE: u64 = 4;
/// The peer may read the range.
const READ: u64 = 8;

/// What a peer may do with an exposed range.
///
/// ```
/// use tierbuf_transport::Access;
/// assert_ne!(Access::Write, Access::Read);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Write into it ([`Endpoint::post_write`](crate::Endpoint::post_write); verbs
    /// `IBV_ACCESS_REMOTE_WRITE`).
    Write,
    /// Read from it ([`Endpoint::post_read`](crate::Endpoint::post_read); verbs
    /// `IBV_ACCESS_REMOTE_READ`).
    Read,
}

impl Access {
    fn bit(self) -> u64 {
        match self {
            Access::Write => WRITE,
            Access::Read => READ,
        }
    }
}

/// Draws the serials of a provider's exposure keys: one counter for all its connections,
/// so that no two exposures of the provider share a key while the serial does not wrap.
#[derive(Debug, Default)]
pub(crate) struct KeySerial {
    next: std::sync::atomic::AtomicU32,
}

impl KeySerial {
    /// The key of a new exposure in `slot`.
    pub(crate) fn key(&self, slot: usize) -> u32 {
        // Serial 0 is skipped so that no key is 0, the word of a free slot.
        let serial = loop {
            let serial = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                & (u32::MAX >> SLOT_BITS);
            if serial != 0 {
                break serial;
            }
        };
        serial << SLOT_BITS | slot as u32
    }
}

/// Where an exposed range lies, as its owner wrote it: the region's remote key, the
/// address of the range's first byte in the owner's address space, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The remote key of the region the range lies in.
    pub region_key: u32,
    /// The range's first byte.
    pub addr: u64,
    /// The range's length.
    pub len: u64,
}

impl Window {
    /// The offset of `[addr, addr + len)` from the window's first byte, if the range lies
    /// inside the window.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let offset = addr.checked_sub(self.addr)?;
        (offset.checked_add(len)? <= self.len).then_some(offset)
    }
}

/// Why the peer's access was refused: nothing was touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No exposure in force has this key (never given, revoked, or another
    /// connection's), or it does not allow the access.
    Key,
}

/// One side's exposures, as its peer sees them. All zeroes is an empty table.
#[repr(C)]
#[derive(Debug)]
pub struct ExposureTable {
    slots: [Slot; EXPOSURE_SLOTS],
}

#[repr(C)]
#[derive(Debug)]
struct Slot {
    /// The key (high 32 bits), access bits, `LIVE` and `ACCESSING`; `FREE` when free.
    word: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    region_key: AtomicU32,
    _reserved: AtomicU32,
}

impl Default for ExposureTable {
    fn default() -> ExposureTable {
        ExposureTable {
            slots: std::array::from_fn(|_| Slot {
                word: AtomicU64::new(FREE),
                addr: AtomicU64::new(0),
                len: AtomicU64::new(0),
                region_key: AtomicU32::new(0),
                _reserved: AtomicU32::new(0),
            }),
        }
    }
}

/// The slot a key names.
pub(crate) fn slot_of(key: u32) -> usize {
    (key as usize) & (EXPOSURE_SLOTS - 1)
}

impl ExposureTable {
    /// The owner's exposure of `window` under `key` (made by [`KeySerial::key`] for a slot
    /// the owner holds free) for `access`.
    pub fn expose(&self, key: u32, access: Access, window: Window) {
        let slot = &self.slots[slot_of(key)];
        slot.region_key.store(window.region_key, Ordering::Relaxed);
        slot.addr.store(window.addr, Ordering::Relaxed);
        slot.len.store(window.len, Ordering::Relaxed);
        slot.word.store(
            u64::from(key) << 32 | access.bit() | LIVE,
            Ordering::Release,
        );
    }

    /// The owner's revocation of the exposure under `key`: no new access begins, and the
    /// call waits until an access in flight has ended, asking `keep_waiting` between looks
    /// (a `false` ends the wait and returns `false`: the peer may still be accessing).
    /// Returns `true` once the peer touches the range no more; the slot is then free.
    pub fn revoke(&self, key: u32, mut keep_waiting: impl FnMut() -> bool) -> bool {
        let word = &self.slots[slot_of(key)].word;
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ExposureRevokeWithoutWait,
        ) {
            word.store(FREE, Ordering::Release);
            return true;
        }
        let mut bits = word.fetch_and(!LIVE, Ordering::AcqRel);
        while bits & ACCESSING != 0 {
            if !keep_waiting() {
                return false;
            }
            crate::sync::yield_now();
            bits = word.load(Ordering::Acquire);
        }
        word.store(FREE, Ordering::Release);
        true
    }

    /// The peer's step before it copies to or from the range exposed under `key`: marks
    /// the slot accessed if the key is in force for `access`, and returns where the range
    /// lies. Call [`ExposureTable::end_access`] after the copy.
    pub fn begin_access(&self, key: u32, access: Access) -> Result<Window, Refused> {
        let slot = &self.slots[slot_of(key)];
        let mut bits = slot.word.load(Ordering::Relaxed);
        loop {
            let in_force = bits >> 32 == u64::from(key)
                && bits & LIVE != 0
                && bits & access.bit() != 0
                && bits & ACCESSING == 0;
            if !in_force {
                return Err(Refused::Key);
            }
            match slot.word.compare_exchange_weak(
                bits,
                bits | ACCESSING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => bits = now,
            }
        }
        Ok(Window {
            region_key: slot.region_key.load(Ordering::Relaxed),
            addr: slot.addr.load(Ordering::Relaxed),
            len: slot.len.load(Ordering::Relaxed),
        })
    }

    /// The region key the slot `key` names holds now: a hint read with no ordering, for a
    /// poster that looks the region up ahead of the access, which checks it again.
    pub fn region_hint(&self, key: u32) -> u32 {
        self.slots[slot_of(key)].region_key.load(Ordering::Relaxed)
    }

    /// Ends the access [`ExposureTable::begin_access`] began under `key`.
    pub fn end_access(&self, key: u32) {
        self.slots[slot_of(key)]
            .word
            .fetch_and(!ACCESSING, Ordering::Release);
    }
}

/// The owner's own record of its exposures: the key of each slot in use and the checked
/// buffer it exposes, whose region stays mapped while it is in force. The shared table is
/// only ever written from here, and never read back but to wait.
#[derive(Debug)]
pub(crate) struct Exposures<R> {
    slots: Vec<Option<(u32, Resolved<R>)>>,
}

impl<R> Default for Exposures<R> {
    fn default() -> Exposures<R> {
        Exposures {
            slots: std::iter::repeat_with(|| None)
                .take(EXPOSURE_SLOTS)
                .collect(),
        }
    }
}

impl<R: Region> Exposures<R> {
    /// A free slot for a new exposure, or the refusal when all are in force.
    pub(crate) fn free_slot(&self) -> Result<usize, PostError> {
        self.slots
            .iter()
            .position(Option::is_none)
            .ok_or(PostError::TooManyExposures {
                max: EXPOSURE_SLOTS,
            })
    }

    /// Exposes `buffer`, checked as `resolved`, under `key` (made for a free slot) for
    /// `access` in `table`, this side's shared table; records it, and marks its region
    /// exposed for good. Returns what to tell the peer.
    pub(crate) fn publish(
        &mut self,
        table: &ExposureTable,
        key: u32,
        access: Access,
        buffer: BufferRef,
        resolved: Resolved<R>,
    ) -> RemoteBuffer {
        resolved.region.mark_exposed();
        let window = Window {
            region_key: buffer.remote_key,
            addr: buffer.addr,
            len: u64::from(buffer.len),
        };
        table.expose(key, access, window);
        self.slots[slot_of(key)] = Some((key, resolved));
        RemoteBuffer {
            key,
            addr: buffer.addr,
            len: buffer.len,
        }
    }

    /// Whether an exposure under `exposed`'s key is recorded; otherwise the refusal.
    pub(crate) fn check(&self, exposed: RemoteBuffer) -> Result<(), PostError> {
        match &self.slots[slot_of(exposed.key)] {
            Some((key, _)) if *key == exposed.key => Ok(()),
            _ => Err(PostError::UnknownKey {
                remote_key: exposed.key,
            }),
        }
    }

    /// Forgets the exposure under `key`, letting its region go.
    pub(crate) fn remove(&mut self, key: u32) {
        let slot = &mut self.slots[slot_of(key)];
        if slot.as_ref().is_some_and(|(held, _)| *held == key) {
            *slot = None;
        }
    }
}
