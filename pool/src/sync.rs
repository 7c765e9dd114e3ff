//! The synchronisation facade: `std` primitives normally, loom's under `cfg(loom)`.
//!
//! Every lock-free structure of this crate takes its atomics and `Arc` from here, so that
//! `RUSTFLAGS="--cfg loom"` model-checks the shipped code rather than a copy of it.
//!
//! Under `cfg(loom)` the module also exposes `planted`: switches that replace one
//! correct step of a protocol with a known bug, so that each loom model can show it
//! catches the bug it was written for. They exist only in loom builds.

#[cfg(all(loom, not(feature = "loom")))]
compile_error!("`--cfg loom` needs the `loom` feature of tierbuf-pool (loom-tests enables it)");

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub mod planted {
    //! Planted bugs for loom's broken-variant models (loom builds only). The list covers
    //! the whole workspace: crates above `pool` ask for their bugs here too.
    //!
    //! A model enables one bug with [`plant`] for the duration of the returned guard;
    //! the code under test asks [`is_planted`] at the step the bug replaces. Models that
    //! plant bugs must not run concurrently with clean models in the same process.

    use std::sync::atomic::{AtomicU32, Ordering};

    /// A known bug that can be planted into the shipped code under `cfg(loom)`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u32)]
    #[non_exhaustive]
    pub enum Bug {
        /// Slot release marks the slot free with `Relaxed` instead of `Release`, so the
        /// next owner may not see the previous owner's writes to the slot.
        SlotReleaseRelaxed = 1,
        /// Slot acquire checks that a slot is free and marks it held as two separate
        /// steps, so two threads can both take it.
        SlotTakeCheckThenSet = 2,
        /// A budget reservation checks the cap and adds the bytes as two separate steps.
        BudgetCheckThenAdd = 3,
        /// A tier change is claimed by checking that none is pending and then storing the
        /// claim, as two separate steps (`tierbuf-tiers`).
        ChangeClaimCheckThenSet = 4,
        /// Reclaiming a replaced tier drops it without first retiring its slot pool, so a
        /// slot still held locally may outlive its tier (`tierbuf-tiers`).
        ReclaimWithoutRetire = 5,
        /// The loopback provider's matching claim is released without checking for work
        /// posted meanwhile, so a post whose claim failed is stranded
        /// (`tierbuf-transport`).
        LoopbackNoRecheckAfterRelease = 6,
        /// A delivered message's drop lowers its connection's count of lent receive slots
        /// with a load and a separate store, so a delivery counted meanwhile on the
        /// connection's thread is lost (`tierbuf-transport`).
        LentCountLoadThenStore = 7,
        /// The shared-memory queues publish a posted receive and a delivery with
        /// `Relaxed` stores instead of `Release`, so the reader may see the count move
        /// before the entry or the message it covers (`tierbuf-transport`).
        ShmPublishRelaxed = 8,
        /// The shared-memory sender checks that the receiver has not shut its gate and
        /// then marks itself copying, as two separate steps, so a closer can miss a copy
        /// in progress and take its buffer back while the peer still writes it
        /// (`tierbuf-transport`).
        ShmCopyGateCheckThenSet = 9,
        /// The shared-memory receiver clears a ring entry's result after publishing the
        /// post that reuses the entry instead of before, so the clear can wipe out the
        /// sender's delivery into it (`tierbuf-transport`).
        ShmClearResultAfterPost = 10,
        /// The shared-memory sender looks at whether the receiver parked before it
        /// publishes its delivery instead of with the read-modify-write that publishes
        /// it, so a receiver that parks in between sleeps through the delivery
        /// (`tierbuf-transport`).
        ShmWakeLookedAtBeforePublish = 11,
        /// A connection's sender looks at whether the connection's thread parked before
        /// it queues its message instead of after, so a thread that parks in between
        /// sleeps with the message queued (`tierbuf-transport`).
        SendQueueWakeBeforePush = 12,
        /// The async connection's claim on the process's one spin checks that no claim
        /// is in force and then stores its own, as two separate steps, so two tasks can
        /// spin at once (`tierbuf-transport`).
        SpinClaimCheckThenSet = 13,
        /// Giving up a spin claim clears the word whatever it holds, so a claim that
        /// lapsed and was given up late clears the claim of the task that replaced it
        /// (`tierbuf-transport`).
        SpinGiveUpUnconditional = 14,
        /// A budget reservation raises the budget's peak with a load and a separate
        /// store, so a reservation that made a smaller total can overwrite the peak a
        /// concurrent one made.
        BudgetPeakLoadThenStore = 15,
        /// A connection table's queuer looks at whether the sleeper sleeps before it
        /// queues the connection instead of after, so a sleeper that begins its sleep in
        /// between sleeps through the connection (`tierbuf-transport`).
        ReadyQueueLookBeforePush = 16,
        /// A connection's senders' queue counts a message it accepts after queueing it
        /// instead of before, so a flush that counts what was queued before it can stop
        /// before a message ahead of one it counted (`tierbuf-transport`).
        SendQueueCountAfterPush = 17,
        /// The shared-memory receiver marks a receive shorter than an inline message
        /// after publishing its post instead of before, so a sender may see the post
        /// without the mark and deliver inline into a buffer too short for it
        /// (`tierbuf-transport`).
        ShmShortMarkedAfterPost = 18,
        /// An exposure's revocation frees its slot without waiting for the peer's access
        /// in flight, so the owner may take the range back while the peer still copies
        /// into it (`tierbuf-transport`).
        ExposureRevokeWithoutWait = 19,
        /// A delivered message's drop pushes the node that gives its receive slot back
        /// with `Relaxed` instead of `Release`, so the connection's thread may read the
        /// node before the slot's write reaches it (`tierbuf-transport`).
        ReturnedPushRelaxed = 20,
    }

    static PLANTED: AtomicU32 = AtomicU32::new(0);

    /// Plants `bug` until the returned guard is dropped.
    pub fn plant(bug: Bug) -> PlantedGuard {
        PLANTED.store(bug as u32, Ordering::SeqCst);
        PlantedGuard { _private: () }
    }

    /// Whether `bug` is planted now.
    pub fn is_planted(bug: Bug) -> bool {
        PLANTED.load(Ordering::Relaxed) == bug as u32
    }

    /// Removes the planted bug when dropped.
    #[derive(Debug)]
    pub struct PlantedGuard {
        _private: (),
    }

    impl Drop for PlantedGuard {
        fn drop(&mut self) {
            PLANTED.store(0, Ordering::SeqCst);
        }
    }
}
