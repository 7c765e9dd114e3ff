//! The synchronisation facade: `std` primitives and `arc-swap` normally, loom's primitives
//! and a loom stand-in for the swap cell under `cfg(loom)`.
//!
//! `arc-swap` is not loom-aware, so under loom [`SwapCell`] is a mutex-guarded `Arc` with a
//! version counter, offering the same operations: load a full reference, swap, and a
//! per-thread cache whose load is one atomic read while nothing changed.

#[cfg(all(loom, not(feature = "loom")))]
compile_error!("`--cfg loom` needs the `loom` feature of tierbuf-tiers (loom-tests enables it)");

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU16, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU16, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};

pub(crate) use swap::{SwapCache, SwapCell};

/// Locks `mutex`, taking the data of a poisoned one: every critical section of this crate
/// leaves its data consistent before anything in it can panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[cfg(not(loom))]
mod swap {
    use std::ops::Deref;
    use std::sync::Arc;

    use arc_swap::{ArcSwap, Cache};

    /// A shared `Arc<T>` that readers load without locks and a writer replaces.
    pub(crate) struct SwapCell<T>(ArcSwap<T>);

    impl<T> SwapCell<T> {
        pub(crate) fn new(value: Arc<T>) -> SwapCell<T> {
            SwapCell(ArcSwap::new(value))
        }

        pub(crate) fn load_full(&self) -> Arc<T> {
            self.0.load_full()
        }

        pub(crate) fn swap(&self, value: Arc<T>) -> Arc<T> {
            self.0.swap(value)
        }

        /// A cache of the cell reached through `cell`: a borrow, or a shared owner.
        pub(crate) fn cache<C: Deref<Target = SwapCell<T>>>(cell: C) -> SwapCache<C, T> {
            SwapCache(Cache::new(Reach(cell)))
        }
    }

    /// The handle a cache reaches its cell through, seen as the `ArcSwap` inside it.
    #[derive(Clone)]
    pub(crate) struct Reach<C>(C);

    impl<T, C: Deref<Target = SwapCell<T>>> Deref for Reach<C> {
        type Target = ArcSwap<T>;

        fn deref(&self) -> &ArcSwap<T> {
            &self.0.0
        }
    }

    /// One thread's cached reference to a [`SwapCell`]'s value, reaching the cell through
    /// `C`. A clone is another such reference, for another thread.
    pub(crate) struct SwapCache<C, T>(Cache<Reach<C>, Arc<T>>);

    impl<C: Clone, T> Clone for SwapCache<C, T> {
        fn clone(&self) -> SwapCache<C, T> {
            SwapCache(self.0.clone())
        }
    }

    impl<T, C: Deref<Target = SwapCell<T>>> SwapCache<C, T> {
        /// The current value: one atomic read when it has not changed since the last load.
        #[inline]
        pub(crate) fn load(&mut self) -> &Arc<T> {
            self.0.load()
        }
    }
}

#[cfg(loom)]
mod swap {
    use std::ops::Deref;

    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::{Arc, Mutex};

    /// Loom stand-in: the value under a mutex, and a version bumped on every swap.
    pub(crate) struct SwapCell<T> {
        current: Mutex<Arc<T>>,
        version: AtomicUsize,
    }

    impl<T> SwapCell<T> {
        pub(crate) fn new(value: Arc<T>) -> SwapCell<T> {
            SwapCell {
                current: Mutex::new(value),
                version: AtomicUsize::new(0),
            }
        }

        pub(crate) fn load_full(&self) -> Arc<T> {
            Arc::clone(&super::lock(&self.current))
        }

        pub(crate) fn swap(&self, value: Arc<T>) -> Arc<T> {
            let mut current = super::lock(&self.current);
            let old = std::mem::replace(&mut *current, value);
            self.version.fetch_add(1, Ordering::Release);
            old
        }

        pub(crate) fn cache<C: Deref<Target = SwapCell<T>>>(cell: C) -> SwapCache<C, T> {
            let (version, cached) = {
                let current = super::lock(&cell.current);
                (cell.version.load(Ordering::Acquire), Arc::clone(&current))
            };
            SwapCache {
                cell,
                version,
                cached,
            }
        }
    }

    pub(crate) struct SwapCache<C, T> {
        cell: C,
        version: usize,
        cached: Arc<T>,
    }

    impl<C: Clone, T> Clone for SwapCache<C, T> {
        fn clone(&self) -> SwapCache<C, T> {
            SwapCache {
                cell: self.cell.clone(),
                version: self.version,
                cached: Arc::clone(&self.cached),
            }
        }
    }

    impl<T, C: Deref<Target = SwapCell<T>>> SwapCache<C, T> {
        pub(crate) fn load(&mut self) -> &Arc<T> {
            if self.cell.version.load(Ordering::Acquire) != self.version {
                let current = super::lock(&self.cell.current);
                self.version = self.cell.version.load(Ordering::Acquire);
                self.cached = Arc::clone(&current);
            }
            &self.cached
        }
    }
}
