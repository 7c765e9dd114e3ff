//! Registration shared by the providers: a [`RegionTable`] of the live regions of one
//! provider by remote key, the [`RegisteredRegion`] handle through which the user owns
//! each, and the per-endpoint [`RegionCache`] through which posts resolve and check
//! buffers. The loopback provider keeps host regions in it, the shared-memory provider
//! sealed memory files, the verbs provider device memory regions.
//!
//! # Invariants
//!
//! - Every region registered is shared as an `Arc<Registered<R>>`: one strong reference
//!   is the user's [`RegisteredRegion`], one more is held by every queued work request that
//!   names it. The memory is unmapped (and its budget returned) only when the last of these
//!   drops, so a provider never copies to or from freed memory.
//! - The table and the caches hold only weak references: a region nobody holds is freed
//!   even if it stays in a cache.
//! - `Registered::live` is cleared (and the table entry removed) when the user drops the
//!   region; from then on resolving its key fails and queued requests naming it complete
//!   with a protection error, as after `ibv_dereg_mr`.
//! - Remote keys are unique among regions whose memory is still mapped (the
//!   [`HostRegistrar`](tierbuf_pool::HostRegistrar) frees a key only when the memory is
//!   unmapped), so the table never holds two live regions under one key.
//! - Resolving takes the table's mutex only when an endpoint meets a key for the first
//!   time (or again after the region behind it was replaced); the post path is lock-free
//!   after that.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

// `RegionCache::known` is looked up on every post: foldhash, not the default SipHash.
use foldhash::HashMap;
use tierbuf_pool::{Region, RegionKeys};

use crate::error::PostError;
use crate::exposure::KeySerial;
use crate::provider::BufferRef;

/// A region registered with a software provider, shared by its owner and the work
/// requests that name it.
#[derive(Debug)]
pub(crate) struct Registered<R> {
    region: R,
    live: AtomicBool,
    /// Set for good once a range of the region is exposed to a peer for one-sided access
    /// (`exposure`): the region then says it is exposed, so a reservoir does not lend it
    /// to another connection.
    exposed: AtomicBool,
}

impl<R: Region> Registered<R> {
    /// The region itself.
    pub(crate) fn region(&self) -> &R {
        &self.region
    }

    /// Whether the owner still holds the region (it has not been deregistered).
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Records that a range of the region was exposed to a peer, for good.
    pub(crate) fn mark_exposed(&self) {
        self.exposed.store(true, Ordering::Release);
    }

    /// The address of the byte at `offset`.
    ///
    /// # Safety
    ///
    /// `offset` is at most the region's length.
    pub(crate) unsafe fn byte_at(&self, offset: usize) -> NonNull<u8> {
        // SAFETY: the caller keeps `offset <= len`, so the result points into the region
        // or one past its end.
        unsafe { self.region.base().add(offset) }
    }
}

/// Live regions of one provider by remote key.
#[derive(Debug)]
pub(crate) struct RegionTable<R> {
    by_key: Mutex<HashMap<u32, Weak<Registered<R>>>>,
    /// The serials of the exposure keys of every endpoint of the provider.
    serial: KeySerial,
}

impl<R: Region> RegionTable<R> {
    pub(crate) fn new() -> RegionTable<R> {
        RegionTable {
            by_key: Mutex::new(HashMap::default()),
            serial: KeySerial::default(),
        }
    }

    /// Records `region` as live and hands back the handle that owns it.
    pub(crate) fn add(self: &Arc<Self>, region: R) -> RegisteredRegion<R> {
        let remote_key = region.keys().remote_key;
        let registered = Arc::new(Registered {
            region,
            live: AtomicBool::new(true),
            exposed: AtomicBool::new(false),
        });
        self.lock().insert(remote_key, Arc::downgrade(&registered));
        RegisteredRegion {
            registered,
            table: Arc::clone(self),
        }
    }

    #[allow(clippy::type_complexity)] // the guard of the field's own type
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Weak<Registered<R>>>> {
        // Every critical section leaves the map consistent before anything can panic.
        self.by_key
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn find(&self, remote_key: u32) -> Option<Arc<Registered<R>>> {
        self.lock()
            .get(&remote_key)
            .and_then(Weak::upgrade)
            .filter(|registered| registered.is_live())
    }
}

/// A region registered with a software provider; dropping it deregisters it.
#[derive(Debug)]
pub(crate) struct RegisteredRegion<R: Region> {
    registered: Arc<Registered<R>>,
    table: Arc<RegionTable<R>>,
}

impl<R: Region> Drop for RegisteredRegion<R> {
    fn drop(&mut self) {
        self.registered.live.store(false, Ordering::Release);
        let remote_key = self.registered.region.keys().remote_key;
        let mut table = self.table.lock();
        // Remove only this region's entry; the key is not reissued while this memory is
        // mapped, so the entry under it is ours.
        if table
            .get(&remote_key)
            .is_some_and(|weak| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&self.registered)))
        {
            table.remove(&remote_key);
        }
    }
}

// SAFETY: the inner region keeps its own promise (its bytes stay valid, fixed and owned
// while it lives) and lives at least as long as this value, because this value holds a
// strong reference to it. The provider's copies reach the bytes only on the owner's
// behalf, through requests the owner posted.
unsafe impl<R: Region> Region for RegisteredRegion<R> {
    fn base(&self) -> NonNull<u8> {
        self.registered.region.base()
    }

    fn len(&self) -> usize {
        self.registered.region.len()
    }

    fn keys(&self) -> RegionKeys {
        self.registered.region.keys()
    }

    fn exposed_to_peer(&self) -> bool {
        self.registered.exposed.load(Ordering::Acquire) || self.registered.region.exposed_to_peer()
    }
}

/// A checked buffer: a strong reference to its region and the buffer's place in it.
#[derive(Debug)]
pub(crate) struct Resolved<R> {
    pub(crate) region: Arc<Registered<R>>,
    /// Offset of the buffer's first byte from the region's first byte; `offset + len`
    /// is at most the region's length.
    pub(crate) offset: usize,
    pub(crate) len: u32,
}

/// An endpoint's memo of the regions it has met, so that resolving a known key takes no
/// lock.
#[derive(Debug)]
pub(crate) struct RegionCache<R> {
    table: Arc<RegionTable<R>>,
    known: HashMap<u32, Weak<Registered<R>>>,
}

impl<R: Region> RegionCache<R> {
    pub(crate) fn new(table: Arc<RegionTable<R>>) -> RegionCache<R> {
        RegionCache {
            table,
            known: HashMap::default(),
        }
    }

    /// Finds the live region `buffer` names and checks that the buffer lies inside it.
    pub(crate) fn resolve(&mut self, buffer: BufferRef) -> Result<Resolved<R>, PostError> {
        let region = match self
            .known
            .get(&buffer.remote_key)
            .and_then(Weak::upgrade)
            .filter(|registered| registered.is_live())
        {
            Some(region) => region,
            None => self.resolve_slow(buffer.remote_key)?,
        };
        let region_addr = region.region.keys().remote_addr;
        let region_len = region.region.len();
        let out_of_bounds = || PostError::OutOfBounds {
            remote_key: buffer.remote_key,
            addr: buffer.addr,
            len: buffer.len,
            region_addr,
            region_len,
        };
        let offset = buffer
            .addr
            .checked_sub(region_addr)
            .and_then(|offset| usize::try_from(offset).ok())
            .ok_or_else(out_of_bounds)?;
        let end = offset
            .checked_add(buffer.len as usize)
            .ok_or_else(out_of_bounds)?;
        if end > region_len {
            return Err(out_of_bounds());
        }
        Ok(Resolved {
            region,
            offset,
            len: buffer.len,
        })
    }

    /// The key of a new exposure in `slot`, unique among the provider's exposures
    /// (`exposure`).
    pub(crate) fn exposure_key(&self, slot: usize) -> u32 {
        self.table.serial.key(slot)
    }

    /// Resolves every buffer of a send's gather list (the caller has checked that it
    /// holds at most `N`); the first that fails fails the whole list.
    pub(crate) fn resolve_gather<const N: usize>(
        &mut self,
        gather: &[BufferRef],
    ) -> Result<[Option<Resolved<R>>; N], PostError> {
        let mut resolved: [Option<Resolved<R>>; N] = std::array::from_fn(|_| None);
        for (slot, buffer) in resolved.iter_mut().zip(gather) {
            *slot = Some(self.resolve(*buffer)?);
        }
        Ok(resolved)
    }

    /// Looks `remote_key` up in the provider's table and remembers it, forgetting regions
    /// that have been deregistered meanwhile.
    #[cold]
    fn resolve_slow(&mut self, remote_key: u32) -> Result<Arc<Registered<R>>, PostError> {
        self.known
            .retain(|_, weak| weak.upgrade().is_some_and(|r| r.is_live()));
        let region = self
            .table
            .find(remote_key)
            .ok_or(PostError::UnknownKey { remote_key })?;
        self.known.insert(remote_key, Arc::downgrade(&region));
        Ok(region)
    }
}
