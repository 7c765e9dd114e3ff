//! The synchronisation facade: `std` primitives and crossbeam's `ArrayQueue` and
//! `SegQueue` normally, loom's primitives and loom stand-ins for the queues under
//! `cfg(loom)`.
//!
//! The loopback provider's hand-over protocol (the per-direction matching claim, see
//! `loopback::channel`) and the shared-memory provider's queues (`shm::segment`) take
//! their atomics, `Arc` and queues from here, so that `RUSTFLAGS="--cfg loom"`
//! model-checks the shipped protocols. crossbeam's queue is not
//! loom-aware; under loom [`BoundedQueue`] is a mutex-guarded `VecDeque` with the same
//! operations, which models the queue as linearizable (what crossbeam documents) and lets
//! loom explore the claim protocol around it.
//!
//! A connection's returned receive slots cross threads in nodes of a stack of its own
//! (`connection::returns`), each slot in an [`UnsafeCell`], so loom checks each hand-over.

#[cfg(all(loom, not(feature = "loom")))]
compile_error!(
    "`--cfg loom` needs the `loom` feature of tierbuf-transport (loom-tests enables it)"
);

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};

#[cfg(not(loom))]
pub(crate) use crossbeam_queue::ArrayQueue as BoundedQueue;
#[cfg(not(loom))]
pub(crate) use crossbeam_queue::SegQueue as UnboundedQueue;

/// A cell whose value a protocol of the caller's hands between threads: `std`'s
/// `UnsafeCell` with loom's interface, and loom's own, which checks every access against
/// the happens-before order, under `cfg(loom)`.
#[cfg(not(loom))]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the value; the caller's protocol makes the access
    /// exclusive.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// Lets another thread run while this one waits for a claim held by it.
#[cfg(not(loom))]
pub(crate) fn yield_now() {
    std::thread::yield_now();
}

/// Lets another thread run while this one waits for a claim held by it.
#[cfg(loom)]
pub(crate) fn yield_now() {
    loom::thread::yield_now();
}

#[cfg(loom)]
pub(crate) use loom_queue::{BoundedQueue, UnboundedQueue};

#[cfg(loom)]
mod loom_queue {
    use std::collections::VecDeque;

    use loom::sync::{Mutex, MutexGuard};

    /// Locks a stand-in's items, taking those of a poisoned lock: every critical
    /// section leaves the queue whole.
    fn lock<T>(items: &Mutex<VecDeque<T>>) -> MutexGuard<'_, VecDeque<T>> {
        items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A bounded FIFO queue with `ArrayQueue`'s operations, for loom models.
    #[derive(Debug)]
    pub(crate) struct BoundedQueue<T> {
        items: Mutex<VecDeque<T>>,
        capacity: usize,
    }

    impl<T> BoundedQueue<T> {
        pub(crate) fn new(capacity: usize) -> BoundedQueue<T> {
            BoundedQueue {
                items: Mutex::new(VecDeque::with_capacity(capacity)),
                capacity,
            }
        }

        pub(crate) fn push(&self, item: T) -> Result<(), T> {
            let mut items = lock(&self.items);
            if items.len() == self.capacity {
                return Err(item);
            }
            items.push_back(item);
            Ok(())
        }

        pub(crate) fn pop(&self) -> Option<T> {
            lock(&self.items).pop_front()
        }

        pub(crate) fn is_empty(&self) -> bool {
            lock(&self.items).is_empty()
        }
    }

    /// An unbounded FIFO queue with `SegQueue`'s operations, for loom models.
    #[derive(Debug)]
    pub(crate) struct UnboundedQueue<T> {
        items: Mutex<VecDeque<T>>,
    }

    impl<T> UnboundedQueue<T> {
        pub(crate) fn new() -> UnboundedQueue<T> {
            UnboundedQueue {
                items: Mutex::new(VecDeque::new()),
            }
        }

        pub(crate) fn push(&self, item: T) {
            lock(&self.items).push_back(item);
        }

        pub(crate) fn pop(&self) -> Option<T> {
            lock(&self.items).pop_front()
        }

        pub(crate) fn is_empty(&self) -> bool {
            lock(&self.items).is_empty()
        }
    }
}
