//! Tier ladders: the ordered sizes a connection's registered buffers are promoted through.
//!
//! A [`TierLadder`] is a list of [`TierSpec`]s, smallest first, plus the [`LadderPolicy`] that
//! decides when a connection steps back down. Every connection starts on
//! [`TierIndex::SMALLEST`]; a message that does not fit its current tier makes it climb to
//! [`TierLadder::tier_for_len`]; a message larger than the top tier is segmented.
//!
//! # Threshold semantics
//!
//! A message (or one element of an I/O vector) of `len` bytes *fits* tier `k` when
//! `len <= promote_threshold(k)`. The threshold never exceeds the tier's size; a threshold
//! below the size promotes early, a tolerance margin (`docs/ladders.md`).
//!
//! # Tier sizes
//!
//! A tier's size ([`TierSpec::slot_size`]) is the message bytes one of its slots carries: a
//! tier of 8 KiB carries an 8 KiB message in one frame. The transport's per-frame header
//! does not come out of it: every registered slot is [`SLOT_HEADROOM`] bytes longer than the
//! size ([`TierSpec::slot_len`]), and a region, the registered memory and every figure of a
//! [`MemoryTable`] count those registered slots.
//!
//! # Invariants kept here
//!
//! Every `TierLadder` (and therefore every `TierSpec`, which only a ladder hands out) has
//! passed the validation of [`TierLadderBuilder::build`], the only way to make one, so code
//! using a ladder may rely on all of these:
//!
//! - there is at least one tier and at most [`MAX_TIERS`], so every index fits a [`TierIndex`];
//! - slot sizes are non-zero multiples of [`SLOT_ALIGN`], at most [`MAX_SLOT_SIZE`], and
//!   strictly increase up the ladder;
//! - slot counts are between [`MIN_SLOT_COUNT`] and [`MAX_SLOT_COUNT`]: every tier can keep
//!   a connection's receives posted, and a tier's count fits a receive queue and the 16-bit
//!   credit grants of a frame header;
//! - thresholds are non-zero, at most their tier's slot size, and strictly increase up the
//!   ladder, so every tier is the smallest fit for some message length;
//! - every region (`slot_len * slot_count`) is at most [`MAX_REGION_LEN`], so it fits the
//!   32-bit lengths of the wire and of verbs, and the send and receive regions of all tiers
//!   added together fit a `u64` (so [`TierSpec::region_len`] and the [`MemoryTable`] never
//!   overflow);
//! - `demote_after` is non-zero, and `demote_after` and `hysteresis` are at most
//!   [`MAX_POLICY_DURATION`], so an `Instant` plus either never overflows;
//! - `reservoir_regions` is at most [`MAX_RESERVOIR_REGIONS`].

mod file;
mod memory;
mod presets;
mod size;

use std::time::Duration;

use crate::TierIndex;

pub use file::LoadError;
pub use memory::{MemoryRow, MemoryTable};
pub use presets::PRESET_NAMES;

/// The most tiers a ladder may have, so that every index and the count itself fit in a `u8`.
pub const MAX_TIERS: usize = u8::MAX as usize;

/// Slot sizes must be multiples of this many bytes: a cache line, so that slots carved from
/// one region never share a cache line and every slot starts suitably aligned for a registrar.
pub const SLOT_ALIGN: usize = 64;

/// The bytes every registered slot holds past its tier's size, for the header a transport
/// writes ahead of each frame's payload: a tier whose size is `N` registers slots of
/// `N + SLOT_HEADROOM` bytes and so carries an `N`-byte message whole. One cache line, so
/// that registered slots stay [`SLOT_ALIGN`]-aligned; the connection layer's 16-byte frame
/// header takes the first 16 of them, and a transport whose header would not fit is refused
/// ([`FrameCapacity::new`](crate::policy::FrameCapacity::new)).
///
/// ```
/// use tierbuf_tiers::ladder::{SLOT_HEADROOM, TierLadder};
/// let ladder = TierLadder::builder().tier(8192, 4, 8192).build()?;
/// assert_eq!(ladder.tiers()[0].slot_len(), 8192 + SLOT_HEADROOM);
/// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
/// ```
pub const SLOT_HEADROOM: usize = SLOT_ALIGN;

/// The fewest slots a tier may have: the receives a connection keeps posted however many
/// messages its user holds. One is the credit data frames leave for credit and control
/// frames, one carries data, and a third lets a credit frame sent to a peer left one credit
/// grant it at least two receives for the one it consumes. With two, two sides each left one
/// credit would either trade one-receive credit frames for ever or wait for each other for
/// ever (`docs/connection.md`, rule 3). The connection layer takes this rule from here.
pub const MIN_SLOT_COUNT: usize = 3;

/// The most slots a tier may have. A connection posts every slot of its receive tier as a
/// receive, so a slot count is a receive-queue depth: 16 384 is past the deepest queue the
/// providers offer (shared memory: 1024 entries; verbs devices: commonly 16 K work
/// requests), and keeps a tier's count within the 16-bit credit grant of a frame header.
pub const MAX_SLOT_COUNT: usize = 1 << 14;

/// The largest tier size: 1 GiB. A slot is one receive buffer, whose length (the size and
/// [`SLOT_HEADROOM`]) travels in 32 bits (a verbs scatter-gather element, a frame's payload
/// length).
pub const MAX_SLOT_SIZE: usize = 1 << 30;

/// The longest region, `slot_len * slot_count`: the largest multiple of [`SLOT_ALIGN`]
/// below 4 GiB, so that a region's length and every offset in it fit 32 bits, as verbs
/// lengths and the negotiation's wire fields are.
pub const MAX_REGION_LEN: usize = u32::MAX as usize & !(SLOT_ALIGN - 1);

/// The most regions of each tier a process keeps registered in reserve.
pub const MAX_RESERVOIR_REGIONS: usize = 1024;

/// The longest `demote_after` and `hysteresis`: a day. Deadlines are the time now plus one
/// of these, which then never overflows an `Instant`.
pub const MAX_POLICY_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// One rung of a ladder: a registered region of `slot_count` slots, each carrying
/// `slot_size` bytes of message and registering [`SLOT_HEADROOM`] more for the frame header.
///
/// Only a validated [`TierLadder`] hands out a `TierSpec`.
///
/// ```
/// use tierbuf_tiers::ladder::TierLadder;
/// let ladder = TierLadder::builder().tier(512, 16, 480).build()?;
/// let tier = &ladder.tiers()[0];
/// assert_eq!(tier.slot_size(), 512);
/// assert_eq!(tier.slot_len(), 576);
/// assert_eq!(tier.slot_count(), 16);
/// assert_eq!(tier.promote_threshold(), 480);
/// assert_eq!(tier.region_len(), 16 * 576);
/// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierSpec {
    slot_size: usize,
    slot_count: usize,
    promote_threshold: usize,
}

impl TierSpec {
    /// The tier's size: the bytes of message one slot carries in one frame (the ladder
    /// file's `slot_size`).
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(8192, 4, 8192).build()?;
    /// assert_eq!(ladder.tiers()[0].slot_size(), 8192);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The bytes one slot registers: the tier's size and [`SLOT_HEADROOM`] for the frame
    /// header. A receive posted at this tier is this long.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(8192, 4, 8192).build()?;
    /// assert_eq!(ladder.tiers()[0].slot_len(), 8192 + 64);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn slot_len(&self) -> usize {
        self.slot_size + SLOT_HEADROOM
    }

    /// How many slots the tier's region holds (one region for sending, one for receiving).
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(8192, 4, 8192).build()?;
    /// assert_eq!(ladder.tiers()[0].slot_count(), 4);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn slot_count(&self) -> usize {
        self.slot_count
    }

    /// The largest message, in bytes, that fits this tier (see the module's threshold semantics).
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 448).build()?;
    /// assert_eq!(ladder.tiers()[0].promote_threshold(), 448);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn promote_threshold(&self) -> usize {
        self.promote_threshold
    }

    /// The length of one of the tier's regions, what it registers: `slot_len * slot_count`.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(8192, 4, 8192).build()?;
    /// assert_eq!(ladder.tiers()[0].region_len(), 4 * (8192 + 64));
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn region_len(&self) -> usize {
        // Validation checked this product (and more) fits.
        self.slot_len() * self.slot_count
    }

    /// Whether a message of `len` bytes fits this tier: `len <= promote_threshold`.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 480).build()?;
    /// assert!(ladder.tiers()[0].fits(480));
    /// assert!(!ladder.tiers()[0].fits(481));
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn fits(&self, len: usize) -> bool {
        len <= self.promote_threshold
    }
}

/// When a connection steps back down the ladder, and what a process keeps registered.
///
/// Defaults: `demote_after` 30 s, `hysteresis` 5 s, `retain_replaced` false (free the
/// regions a promotion replaces), `reservoir_regions` 0 (register nothing nobody asked for).
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::ladder::LadderPolicy;
/// let policy = LadderPolicy::default();
/// assert_eq!(policy.demote_after(), Duration::from_secs(30));
/// assert_eq!(policy.hysteresis(), Duration::from_secs(5));
/// assert!(!policy.retain_replaced());
/// assert_eq!(policy.reservoir_regions(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LadderPolicy {
    demote_after: Duration,
    hysteresis: Duration,
    retain_replaced: bool,
    reservoir_regions: usize,
}

impl Default for LadderPolicy {
    fn default() -> LadderPolicy {
        LadderPolicy {
            demote_after: Duration::from_secs(30),
            hysteresis: Duration::from_secs(5),
            retain_replaced: false,
            reservoir_regions: 0,
        }
    }
}

impl LadderPolicy {
    /// Idle time before a connection is demoted (to the smallest tier every message of that
    /// window fits, possibly several steps down): the time since the last message
    /// that needed its current tier (one that did not fit the tier below). Never zero.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 512).demote_after(Duration::from_secs(9)).build()?;
    /// assert_eq!(ladder.policy().demote_after(), Duration::from_secs(9));
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn demote_after(&self) -> Duration {
        self.demote_after
    }

    /// Minimum time a connection stays on a tier after being promoted to it before it may be
    /// demoted, however idle it is, so that a connection does not flap between tiers.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 512).hysteresis(Duration::from_secs(2)).build()?;
    /// assert_eq!(ladder.policy().hysteresis(), Duration::from_secs(2));
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn hysteresis(&self) -> Duration {
        self.hysteresis
    }

    /// Whether a promoted connection keeps the regions of the tiers below registered (demotion
    /// is then free) instead of freeing them on promotion (less memory per connection).
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 512).retain_replaced(true).build()?;
    /// assert!(ladder.policy().retain_replaced());
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn retain_replaced(&self) -> bool {
        self.retain_replaced
    }

    /// How many regions of each tier a process keeps registered in reserve, shared by all its
    /// connections, so that a promotion need not wait for a registration.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 4, 512).reservoir_regions(2).build()?;
    /// assert_eq!(ladder.policy().reservoir_regions(), 2);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn reservoir_regions(&self) -> usize {
        self.reservoir_regions
    }

    /// Whether a connection that has been on its tier for `time_on_tier` and idle (see
    /// [`demote_after`](Self::demote_after)) for `idle` may now be demoted: both the idle time
    /// and the hysteresis must have passed.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tierbuf_tiers::ladder::LadderPolicy;
    /// let policy = LadderPolicy::default(); // 30 s idle, 5 s hysteresis
    /// let s = Duration::from_secs;
    /// assert!(policy.may_demote(s(40), s(30)));
    /// assert!(!policy.may_demote(s(40), s(29)));
    /// assert!(!policy.may_demote(s(4), s(30)), "promoted too recently");
    /// ```
    pub fn may_demote(&self, time_on_tier: Duration, idle: Duration) -> bool {
        idle >= self.demote_after && time_on_tier >= self.hysteresis
    }
}

/// A validation failure: each violated rule is its own variant, naming the tier and field.
///
/// ```
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_tiers::ladder::{LadderError, TierLadder};
/// let err = TierLadder::builder().tier(512, 16, 600).build().unwrap_err();
/// assert_eq!(
///     err,
///     LadderError::PromoteThresholdExceedsSlot { tier: TierIndex::SMALLEST, promote_threshold: 600, slot_size: 512 }
/// );
/// assert_eq!(err.tier(), Some(TierIndex::SMALLEST));
/// assert_eq!(err.field(), "promote_threshold");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LadderError {
    /// The ladder has no tier.
    #[error("a ladder needs at least one [[tier]]")]
    NoTiers,
    /// The ladder has more than [`MAX_TIERS`] tiers.
    #[error("a ladder has at most {max} tiers, this one has {count}")]
    TooManyTiers {
        /// How many tiers were given.
        count: usize,
        /// The most allowed, [`MAX_TIERS`].
        max: usize,
    },
    /// A slot size is zero.
    #[error("{tier}: slot_size must be greater than 0")]
    SlotSizeZero {
        /// The offending tier.
        tier: TierIndex,
    },
    /// A slot size is not a multiple of [`SLOT_ALIGN`].
    #[error("{tier}: slot_size {slot_size} is not a multiple of {alignment} bytes")]
    SlotSizeUnaligned {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot size.
        slot_size: usize,
        /// The required alignment, [`SLOT_ALIGN`].
        alignment: usize,
    },
    /// A slot size is not larger than the slot size of the tier below.
    #[error(
        "{tier}: slot_size {slot_size} is not larger than the slot_size {below} of the tier below"
    )]
    SlotSizeNotIncreasing {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot size.
        slot_size: usize,
        /// The slot size of the tier below.
        below: usize,
    },
    /// A slot size is past [`MAX_SLOT_SIZE`].
    #[error("{tier}: slot_size {slot_size} passes the maximum of {max} bytes")]
    SlotSizeTooLarge {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot size.
        slot_size: usize,
        /// The largest allowed, [`MAX_SLOT_SIZE`].
        max: usize,
    },
    /// A slot count is zero.
    #[error("{tier}: slot_count must be greater than 0")]
    SlotCountZero {
        /// The offending tier.
        tier: TierIndex,
    },
    /// A slot count is below [`MIN_SLOT_COUNT`]: a connection could not keep its receives
    /// posted on the tier.
    #[error(
        "{tier}: slot_count {slot_count} is below {min}, the receives a connection keeps posted"
    )]
    TooFewSlots {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot count.
        slot_count: usize,
        /// The fewest allowed, [`MIN_SLOT_COUNT`].
        min: usize,
    },
    /// A slot count is past [`MAX_SLOT_COUNT`].
    #[error("{tier}: slot_count {slot_count} passes the maximum of {max}")]
    TooManySlots {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot count.
        slot_count: usize,
        /// The most allowed, [`MAX_SLOT_COUNT`].
        max: usize,
    },
    /// A promotion threshold is zero.
    #[error("{tier}: promote_threshold must be greater than 0")]
    PromoteThresholdZero {
        /// The offending tier.
        tier: TierIndex,
    },
    /// A promotion threshold exceeds its tier's slot size.
    #[error("{tier}: promote_threshold {promote_threshold} exceeds the slot_size {slot_size}")]
    PromoteThresholdExceedsSlot {
        /// The offending tier.
        tier: TierIndex,
        /// Its threshold.
        promote_threshold: usize,
        /// Its slot size.
        slot_size: usize,
    },
    /// A promotion threshold is not larger than the threshold of the tier below, so no
    /// message would ever need this tier.
    #[error(
        "{tier}: promote_threshold {promote_threshold} is not larger than the promote_threshold {below} of the tier below, so no message would ever need this tier"
    )]
    PromoteThresholdNotIncreasing {
        /// The offending tier.
        tier: TierIndex,
        /// Its threshold.
        promote_threshold: usize,
        /// The threshold of the tier below.
        below: usize,
    },
    /// The tier's region, `slot_len * slot_count`, is past [`MAX_REGION_LEN`].
    #[error(
        "{tier}: slot_count {slot_count} of slot_size {slot_size} (each registering {SLOT_HEADROOM} bytes more) makes a region past the maximum of {MAX_REGION_LEN} bytes"
    )]
    RegionTooLarge {
        /// The offending tier.
        tier: TierIndex,
        /// Its slot size.
        slot_size: usize,
        /// Its slot count.
        slot_count: usize,
    },
    /// The policy's `demote_after` is zero, which would demote after every message.
    #[error("policy: demote_after must be greater than 0")]
    DemoteAfterZero,
    /// The policy's `demote_after` or `hysteresis` is past [`MAX_POLICY_DURATION`].
    #[error("policy: {field} {} passes the maximum of {}", humantime::format_duration(*.duration), humantime::format_duration(*.max))]
    DurationTooLong {
        /// The key: `demote_after` or `hysteresis`.
        field: &'static str,
        /// Its value.
        duration: Duration,
        /// The longest allowed, [`MAX_POLICY_DURATION`].
        max: Duration,
    },
    /// The policy's `reservoir_regions` is past [`MAX_RESERVOIR_REGIONS`].
    #[error("policy: reservoir_regions {reservoir_regions} passes the maximum of {max}")]
    TooManyReservoirRegions {
        /// Its value.
        reservoir_regions: usize,
        /// The most allowed, [`MAX_RESERVOIR_REGIONS`].
        max: usize,
    },
}

impl LadderError {
    /// The tier the error is about, if it is about one tier.
    ///
    /// ```
    /// # use tierbuf_tiers::{TierIndex, ladder::TierLadder};
    /// let err = TierLadder::builder().tier(512, 3, 512).tier(512, 3, 512).build().unwrap_err();
    /// assert_eq!(err.tier(), Some(TierIndex::new(1)));
    /// ```
    pub fn tier(&self) -> Option<TierIndex> {
        match *self {
            LadderError::NoTiers
            | LadderError::TooManyTiers { .. }
            | LadderError::DemoteAfterZero
            | LadderError::DurationTooLong { .. }
            | LadderError::TooManyReservoirRegions { .. } => None,
            LadderError::SlotSizeZero { tier }
            | LadderError::SlotSizeUnaligned { tier, .. }
            | LadderError::SlotSizeTooLarge { tier, .. }
            | LadderError::SlotSizeNotIncreasing { tier, .. }
            | LadderError::SlotCountZero { tier }
            | LadderError::TooFewSlots { tier, .. }
            | LadderError::TooManySlots { tier, .. }
            | LadderError::PromoteThresholdZero { tier }
            | LadderError::PromoteThresholdExceedsSlot { tier, .. }
            | LadderError::PromoteThresholdNotIncreasing { tier, .. }
            | LadderError::RegionTooLarge { tier, .. } => Some(tier),
        }
    }

    /// The ladder file key the error is about: `tier` (the list of tiers itself),
    /// `slot_size`, `slot_count`, `promote_threshold`, `demote_after`, `hysteresis` or
    /// `reservoir_regions`.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let err = TierLadder::builder().tier(512, 0, 512).build().unwrap_err();
    /// assert_eq!(err.field(), "slot_count");
    /// ```
    pub fn field(&self) -> &'static str {
        match self {
            LadderError::NoTiers | LadderError::TooManyTiers { .. } => "tier",
            LadderError::SlotSizeZero { .. }
            | LadderError::SlotSizeUnaligned { .. }
            | LadderError::SlotSizeTooLarge { .. }
            | LadderError::SlotSizeNotIncreasing { .. } => "slot_size",
            LadderError::SlotCountZero { .. }
            | LadderError::TooFewSlots { .. }
            | LadderError::TooManySlots { .. }
            | LadderError::RegionTooLarge { .. } => "slot_count",
            LadderError::PromoteThresholdZero { .. }
            | LadderError::PromoteThresholdExceedsSlot { .. }
            | LadderError::PromoteThresholdNotIncreasing { .. } => "promote_threshold",
            LadderError::DemoteAfterZero => "demote_after",
            LadderError::DurationTooLong { field, .. } => field,
            LadderError::TooManyReservoirRegions { .. } => "reservoir_regions",
        }
    }
}

/// An ordered, validated list of tiers, smallest first, and the policy for moving between them.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_tiers::ladder::TierLadder;
/// let ladder = TierLadder::builder()
///     .tier(512, 64, 480)
///     .tier(8192, 32, 8192)
///     .demote_after(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(ladder.len(), 2);
/// assert_eq!(ladder.top(), TierIndex::new(1));
/// assert_eq!(ladder.tier_for_len(100), Some(TierIndex::SMALLEST));
/// assert_eq!(ladder.tier_for_len(481), Some(TierIndex::new(1)));
/// assert_eq!(ladder.tier_for_len(8193), None, "segmented");
/// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TierLadder {
    tiers: Vec<TierSpec>,
    policy: LadderPolicy,
}

impl TierLadder {
    /// A builder for a ladder in code; [`TierLadderBuilder::build`] validates it.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(4096, 8, 4096).build()?;
    /// assert_eq!(ladder.len(), 1);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn builder() -> TierLadderBuilder {
        TierLadderBuilder::default()
    }

    /// Validates `(slot_size, slot_count, promote_threshold)` triples, smallest tier first,
    /// and a policy into a ladder; the first rule broken is reported.
    fn new(
        tiers: &[(usize, usize, usize)],
        policy: LadderPolicy,
    ) -> Result<TierLadder, LadderError> {
        if tiers.is_empty() {
            return Err(LadderError::NoTiers);
        }
        if tiers.len() > MAX_TIERS {
            return Err(LadderError::TooManyTiers {
                count: tiers.len(),
                max: MAX_TIERS,
            });
        }
        let mut specs: Vec<TierSpec> = Vec::with_capacity(tiers.len());
        for (position, &(slot_size, slot_count, promote_threshold)) in tiers.iter().enumerate() {
            let tier = TierIndex::new(position as u8);
            let below = specs.last();
            if slot_size == 0 {
                return Err(LadderError::SlotSizeZero { tier });
            }
            if slot_size % SLOT_ALIGN != 0 {
                return Err(LadderError::SlotSizeUnaligned {
                    tier,
                    slot_size,
                    alignment: SLOT_ALIGN,
                });
            }
            if slot_size > MAX_SLOT_SIZE {
                return Err(LadderError::SlotSizeTooLarge {
                    tier,
                    slot_size,
                    max: MAX_SLOT_SIZE,
                });
            }
            if let Some(below) = below.filter(|below| slot_size <= below.slot_size) {
                return Err(LadderError::SlotSizeNotIncreasing {
                    tier,
                    slot_size,
                    below: below.slot_size,
                });
            }
            if slot_count == 0 {
                return Err(LadderError::SlotCountZero { tier });
            }
            if slot_count < MIN_SLOT_COUNT {
                return Err(LadderError::TooFewSlots {
                    tier,
                    slot_count,
                    min: MIN_SLOT_COUNT,
                });
            }
            if slot_count > MAX_SLOT_COUNT {
                return Err(LadderError::TooManySlots {
                    tier,
                    slot_count,
                    max: MAX_SLOT_COUNT,
                });
            }
            if promote_threshold == 0 {
                return Err(LadderError::PromoteThresholdZero { tier });
            }
            if promote_threshold > slot_size {
                return Err(LadderError::PromoteThresholdExceedsSlot {
                    tier,
                    promote_threshold,
                    slot_size,
                });
            }
            if let Some(below) = below.filter(|below| promote_threshold <= below.promote_threshold)
            {
                return Err(LadderError::PromoteThresholdNotIncreasing {
                    tier,
                    promote_threshold,
                    below: below.promote_threshold,
                });
            }
            // With every region within 32 bits, the send and receive regions of at most
            // `MAX_TIERS` tiers together stay far within a `u64`.
            // `slot_size` is at most `MAX_SLOT_SIZE`, so adding the headroom cannot overflow.
            if (slot_size + SLOT_HEADROOM)
                .checked_mul(slot_count)
                .is_none_or(|region_len| region_len > MAX_REGION_LEN)
            {
                return Err(LadderError::RegionTooLarge {
                    tier,
                    slot_size,
                    slot_count,
                });
            }
            specs.push(TierSpec {
                slot_size,
                slot_count,
                promote_threshold,
            });
        }
        if policy.demote_after.is_zero() {
            return Err(LadderError::DemoteAfterZero);
        }
        for (field, duration) in [
            ("demote_after", policy.demote_after),
            ("hysteresis", policy.hysteresis),
        ] {
            if duration > MAX_POLICY_DURATION {
                return Err(LadderError::DurationTooLong {
                    field,
                    duration,
                    max: MAX_POLICY_DURATION,
                });
            }
        }
        if policy.reservoir_regions > MAX_RESERVOIR_REGIONS {
            return Err(LadderError::TooManyReservoirRegions {
                reservoir_regions: policy.reservoir_regions,
                max: MAX_RESERVOIR_REGIONS,
            });
        }
        Ok(TierLadder {
            tiers: specs,
            policy,
        })
    }

    /// The tiers, smallest first.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::preset("two-tier")?;
    /// let sizes: Vec<usize> = ladder.tiers().iter().map(|t| t.slot_size()).collect();
    /// assert_eq!(sizes, [512, 8192]);
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn tiers(&self) -> &[TierSpec] {
        &self.tiers
    }

    /// The tier at `index`, or `None` past the top.
    ///
    /// ```
    /// # use tierbuf_tiers::{TierIndex, ladder::TierLadder};
    /// let ladder = TierLadder::preset("two-tier")?;
    /// assert_eq!(ladder.tier(TierIndex::new(1)).map(|t| t.slot_size()), Some(8192));
    /// assert!(ladder.tier(TierIndex::new(2)).is_none());
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn tier(&self, index: TierIndex) -> Option<&TierSpec> {
        self.tiers.get(usize::from(index.get()))
    }

    /// The tiers with their indices, smallest first.
    ///
    /// ```
    /// # use tierbuf_tiers::{TierIndex, ladder::TierLadder};
    /// let ladder = TierLadder::preset("two-tier")?;
    /// let (top, spec) = ladder.iter().last().unwrap();
    /// assert_eq!((top, spec.slot_size()), (TierIndex::new(1), 8192));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (TierIndex, &TierSpec)> {
        // Validation keeps the count within u8.
        self.tiers
            .iter()
            .enumerate()
            .map(|(position, spec)| (TierIndex::new(position as u8), spec))
    }

    /// The index of the largest tier.
    ///
    /// ```
    /// # use tierbuf_tiers::{TierIndex, ladder::TierLadder};
    /// assert_eq!(TierLadder::preset("storage")?.top(), TierIndex::new(2));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn top(&self) -> TierIndex {
        TierIndex::new((self.tiers.len() - 1) as u8)
    }

    /// How many tiers the ladder has (at least 1).
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// assert_eq!(TierLadder::preset("rpc")?.len(), 3);
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    #[allow(clippy::len_without_is_empty, reason = "a ladder is never empty")]
    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    /// The policy for demotion and reserve regions.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// assert!(!TierLadder::preset("two-tier")?.policy().retain_replaced());
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn policy(&self) -> &LadderPolicy {
        &self.policy
    }

    /// The smallest tier a message (or I/O-vector element) of `len` bytes fits, or `None` when
    /// it is longer than the top tier's threshold and must be segmented.
    ///
    /// ```
    /// # use tierbuf_tiers::{TierIndex, ladder::TierLadder};
    /// let ladder = TierLadder::preset("two-tier")?; // thresholds 480 and 8192
    /// assert_eq!(ladder.tier_for_len(0), Some(TierIndex::SMALLEST));
    /// assert_eq!(ladder.tier_for_len(480), Some(TierIndex::SMALLEST));
    /// assert_eq!(ladder.tier_for_len(481), Some(TierIndex::new(1)));
    /// assert_eq!(ladder.tier_for_len(8192), Some(TierIndex::new(1)));
    /// assert_eq!(ladder.tier_for_len(8193), None);
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn tier_for_len(&self, len: usize) -> Option<TierIndex> {
        // Thresholds strictly increase, so the tiers that do not fit form a prefix.
        let position = self.tiers.partition_point(|spec| !spec.fits(len));
        (position < self.tiers.len()).then(|| TierIndex::new(position as u8))
    }

    /// What a connection registers at each tier, and for `connections` connections.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let table = TierLadder::preset("two-tier")?.memory_table(1);
    /// assert_eq!(table.rows()[0].per_connection(), 2 * 16 * (512 + 64)); // 18 KiB
    /// assert_eq!(table.static_per_connection(), 2 * 16 * (8192 + 64)); // 258 KiB
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn memory_table(&self, connections: usize) -> MemoryTable {
        MemoryTable::new(self, connections)
    }
}

/// Builds a [`TierLadder`] in code, with the same validation as a ladder file.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::ladder::{LadderError, TierLadder};
/// let ladder = TierLadder::builder()
///     .tier(512, 64, 480)
///     .tier(8192, 32, 8192)
///     .demote_after(Duration::from_secs(60))
///     .hysteresis(Duration::from_secs(10))
///     .retain_replaced(true)
///     .reservoir_regions(4)
///     .build()?;
/// assert_eq!(ladder.policy().reservoir_regions(), 4);
///
/// let unaligned = TierLadder::builder().tier(500, 64, 480).build();
/// assert!(matches!(unaligned, Err(LadderError::SlotSizeUnaligned { .. })));
/// # Ok::<(), LadderError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct TierLadderBuilder {
    tiers: Vec<(usize, usize, usize)>,
    policy: LadderPolicy,
}

impl TierLadderBuilder {
    /// Adds the next larger tier: `slot_count` slots of `slot_size` bytes, fitting messages of
    /// up to `promote_threshold` bytes.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 8, 512).tier(4096, 8, 4096).build()?;
    /// assert_eq!(ladder.len(), 2);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn tier(mut self, slot_size: usize, slot_count: usize, promote_threshold: usize) -> Self {
        self.tiers.push((slot_size, slot_count, promote_threshold));
        self
    }

    /// Replaces the whole policy.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::{LadderPolicy, TierLadder};
    /// let ladder = TierLadder::builder().tier(512, 8, 512).policy(LadderPolicy::default()).build()?;
    /// assert_eq!(*ladder.policy(), LadderPolicy::default());
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn policy(mut self, policy: LadderPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`LadderPolicy::demote_after`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tierbuf_tiers::ladder::{LadderError, TierLadder};
    /// let zero = TierLadder::builder().tier(512, 8, 512).demote_after(Duration::ZERO).build();
    /// assert_eq!(zero, Err(LadderError::DemoteAfterZero));
    /// ```
    pub fn demote_after(mut self, demote_after: Duration) -> Self {
        self.policy.demote_after = demote_after;
        self
    }

    /// Sets [`LadderPolicy::hysteresis`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 8, 512).hysteresis(Duration::ZERO).build()?;
    /// assert!(ladder.policy().hysteresis().is_zero());
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn hysteresis(mut self, hysteresis: Duration) -> Self {
        self.policy.hysteresis = hysteresis;
        self
    }

    /// Sets [`LadderPolicy::retain_replaced`].
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 8, 512).retain_replaced(true).build()?;
    /// assert!(ladder.policy().retain_replaced());
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn retain_replaced(mut self, retain_replaced: bool) -> Self {
        self.policy.retain_replaced = retain_replaced;
        self
    }

    /// Sets [`LadderPolicy::reservoir_regions`].
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let ladder = TierLadder::builder().tier(512, 8, 512).reservoir_regions(3).build()?;
    /// assert_eq!(ladder.policy().reservoir_regions(), 3);
    /// # Ok::<(), tierbuf_tiers::ladder::LadderError>(())
    /// ```
    pub fn reservoir_regions(mut self, reservoir_regions: usize) -> Self {
        self.policy.reservoir_regions = reservoir_regions;
        self
    }

    /// Validates the tiers and policy into a ladder.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::{LadderError, TierLadder};
    /// assert_eq!(TierLadder::builder().build(), Err(LadderError::NoTiers));
    /// ```
    pub fn build(&self) -> Result<TierLadder, LadderError> {
        TierLadder::new(&self.tiers, self.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(index: u8) -> TierIndex {
        TierIndex::new(index)
    }

    #[test]
    fn a_valid_ladder_keeps_its_tiers_and_policy() {
        let ladder = TierLadder::builder()
            .tier(512, 64, 480)
            .tier(8192, 32, 8192)
            .demote_after(Duration::from_millis(250))
            .hysteresis(Duration::from_secs(1))
            .retain_replaced(true)
            .reservoir_regions(2)
            .build()
            .unwrap();
        assert_eq!(ladder.len(), 2);
        assert_eq!(ladder.top(), tier(1));
        assert_eq!(ladder.tier(tier(0)).unwrap().region_len(), (512 + 64) * 64);
        assert_eq!(ladder.tier(tier(1)).unwrap().region_len(), (8192 + 64) * 32);
        assert_eq!(ladder.policy().demote_after(), Duration::from_millis(250));
        assert_eq!(ladder.policy().hysteresis(), Duration::from_secs(1));
        assert!(ladder.policy().retain_replaced());
        assert_eq!(ladder.policy().reservoir_regions(), 2);
    }

    #[test]
    fn no_tiers_is_an_error() {
        assert_eq!(TierLadder::builder().build(), Err(LadderError::NoTiers));
    }

    #[test]
    fn more_than_255_tiers_is_an_error_and_255_is_fine() {
        let ladder_of = |count: usize| {
            (1..=count)
                .fold(TierLadder::builder(), |builder, step| {
                    builder.tier(step * 64, 3, step * 64)
                })
                .build()
        };
        let full = ladder_of(MAX_TIERS).unwrap();
        assert_eq!(full.top(), tier(254));
        assert_eq!(
            ladder_of(MAX_TIERS + 1),
            Err(LadderError::TooManyTiers {
                count: 256,
                max: 255
            })
        );
    }

    #[test]
    fn each_broken_tier_rule_is_its_own_error() {
        let cases: [(TierLadderBuilder, LadderError); 8] = [
            (
                TierLadder::builder().tier(0, 3, 1),
                LadderError::SlotSizeZero { tier: tier(0) },
            ),
            (
                TierLadder::builder().tier(512, 3, 512).tier(1000, 3, 1000),
                LadderError::SlotSizeUnaligned {
                    tier: tier(1),
                    slot_size: 1000,
                    alignment: 64,
                },
            ),
            (
                TierLadder::builder().tier(512, 3, 256).tier(512, 3, 512),
                LadderError::SlotSizeNotIncreasing {
                    tier: tier(1),
                    slot_size: 512,
                    below: 512,
                },
            ),
            (
                TierLadder::builder().tier(1024, 3, 256).tier(512, 3, 512),
                LadderError::SlotSizeNotIncreasing {
                    tier: tier(1),
                    slot_size: 512,
                    below: 1024,
                },
            ),
            (
                TierLadder::builder().tier(512, 0, 512),
                LadderError::SlotCountZero { tier: tier(0) },
            ),
            (
                TierLadder::builder().tier(512, 3, 0),
                LadderError::PromoteThresholdZero { tier: tier(0) },
            ),
            (
                TierLadder::builder().tier(512, 3, 513),
                LadderError::PromoteThresholdExceedsSlot {
                    tier: tier(0),
                    promote_threshold: 513,
                    slot_size: 512,
                },
            ),
            (
                TierLadder::builder().tier(512, 3, 512).tier(1024, 3, 500),
                LadderError::PromoteThresholdNotIncreasing {
                    tier: tier(1),
                    promote_threshold: 500,
                    below: 512,
                },
            ),
        ];
        for (builder, expected) in cases {
            assert_eq!(builder.build(), Err(expected));
        }
    }

    #[test]
    fn each_bound_on_sizes_and_counts_is_its_own_error() {
        let cases: [(TierLadderBuilder, LadderError); 6] = [
            (
                TierLadder::builder().tier(512, 2, 512),
                LadderError::TooFewSlots {
                    tier: tier(0),
                    slot_count: 2,
                    min: MIN_SLOT_COUNT,
                },
            ),
            (
                TierLadder::builder().tier(512, 3, 512).tier(1024, 1, 1024),
                LadderError::TooFewSlots {
                    tier: tier(1),
                    slot_count: 1,
                    min: MIN_SLOT_COUNT,
                },
            ),
            (
                TierLadder::builder().tier(64, MAX_SLOT_COUNT + 1, 64),
                LadderError::TooManySlots {
                    tier: tier(0),
                    slot_count: MAX_SLOT_COUNT + 1,
                    max: MAX_SLOT_COUNT,
                },
            ),
            (
                TierLadder::builder().tier(64, usize::MAX, 64),
                LadderError::TooManySlots {
                    tier: tier(0),
                    slot_count: usize::MAX,
                    max: MAX_SLOT_COUNT,
                },
            ),
            (
                TierLadder::builder().tier(MAX_SLOT_SIZE + 64, 3, 64),
                LadderError::SlotSizeTooLarge {
                    tier: tier(0),
                    slot_size: MAX_SLOT_SIZE + 64,
                    max: MAX_SLOT_SIZE,
                },
            ),
            (
                // 16 slots of 256 MiB less 64 B would fit, but each registers 64 B of
                // headroom: 4 GiB, one cache line past the largest region.
                TierLadder::builder()
                    .tier(512, 3, 512)
                    .tier((256 << 20) - SLOT_HEADROOM, 16, 1024),
                LadderError::RegionTooLarge {
                    tier: tier(1),
                    slot_size: (256 << 20) - SLOT_HEADROOM,
                    slot_count: 16,
                },
            ),
        ];
        for (builder, expected) in cases {
            assert_eq!(builder.build(), Err(expected));
        }
        // Every bound is reachable: a ladder at all of them is valid.
        let at_the_limits = TierLadder::builder()
            .tier(64, MAX_SLOT_COUNT, 64)
            .tier(MAX_REGION_LEN / 4 / 64 * 64 - SLOT_HEADROOM, 4, 128)
            .tier(MAX_SLOT_SIZE, MIN_SLOT_COUNT, MAX_SLOT_SIZE)
            .demote_after(MAX_POLICY_DURATION)
            .hysteresis(MAX_POLICY_DURATION)
            .reservoir_regions(MAX_RESERVOIR_REGIONS)
            .build()
            .unwrap();
        assert_eq!(at_the_limits.tiers()[0].region_len(), 2 << 20);
        assert!(at_the_limits.tiers()[1].region_len() <= MAX_REGION_LEN);
    }

    #[test]
    fn policy_durations_and_reservoir_regions_are_bounded() {
        let base = TierLadder::builder().tier(512, 3, 512);
        let too_long = MAX_POLICY_DURATION + Duration::from_nanos(1);
        for (builder, field, duration) in [
            (
                base.clone().demote_after(too_long),
                "demote_after",
                too_long,
            ),
            (base.clone().hysteresis(too_long), "hysteresis", too_long),
            (
                base.clone().hysteresis(Duration::MAX),
                "hysteresis",
                Duration::MAX,
            ),
        ] {
            let err = builder.build().unwrap_err();
            assert_eq!(
                err,
                LadderError::DurationTooLong {
                    field,
                    duration,
                    max: MAX_POLICY_DURATION
                }
            );
            assert_eq!((err.tier(), err.field()), (None, field));
        }
        let err = base
            .clone()
            .reservoir_regions(usize::MAX)
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            LadderError::TooManyReservoirRegions {
                reservoir_regions: usize::MAX,
                max: MAX_RESERVOIR_REGIONS
            }
        );
        assert_eq!(err.field(), "reservoir_regions");
        assert_eq!(
            err.to_string(),
            "policy: reservoir_regions 18446744073709551615 passes the maximum of 1024"
        );
        assert_eq!(
            base.hysteresis(Duration::from_secs(u64::MAX))
                .build()
                .unwrap_err()
                .to_string(),
            "policy: hysteresis 584542046090years 7months 15days 17h 5m 3s passes the maximum of 1day"
        );
    }

    #[test]
    fn zero_demote_after_is_an_error_but_zero_hysteresis_is_not() {
        let base = TierLadder::builder().tier(512, 3, 512);
        assert_eq!(
            base.clone().demote_after(Duration::ZERO).build(),
            Err(LadderError::DemoteAfterZero)
        );
        assert!(base.hysteresis(Duration::ZERO).build().is_ok());
    }

    #[test]
    fn errors_name_their_tier_and_field() {
        let err = TierLadder::builder()
            .tier(512, 3, 512)
            .tier(1000, 3, 1000)
            .build()
            .unwrap_err();
        assert_eq!((err.tier(), err.field()), (Some(tier(1)), "slot_size"));
        assert_eq!(
            err.to_string(),
            "tier 1: slot_size 1000 is not a multiple of 64 bytes"
        );
        assert_eq!(LadderError::DemoteAfterZero.tier(), None);
        assert_eq!(LadderError::DemoteAfterZero.field(), "demote_after");
        assert_eq!(LadderError::NoTiers.field(), "tier");
    }

    #[test]
    fn tier_for_len_picks_the_smallest_fitting_tier() {
        let ladder = TierLadder::builder()
            .tier(512, 3, 448)
            .tier(4096, 3, 4096)
            .tier(65536, 3, 65536)
            .build()
            .unwrap();
        let expectations = [
            (0, Some(0)),
            (1, Some(0)),
            (448, Some(0)),
            (449, Some(1)),
            (512, Some(1)),
            (4096, Some(1)),
            (4097, Some(2)),
            (65536, Some(2)),
        ];
        for (len, expected) in expectations {
            assert_eq!(ladder.tier_for_len(len), expected.map(tier), "len {len}");
        }
        assert_eq!(ladder.tier_for_len(65537), None);
        assert_eq!(ladder.tier_for_len(usize::MAX), None);
    }

    #[test]
    fn may_demote_needs_both_idle_time_and_hysteresis() {
        let ladder = TierLadder::builder()
            .tier(512, 3, 512)
            .demote_after(Duration::from_secs(10))
            .hysteresis(Duration::from_secs(60))
            .build()
            .unwrap();
        let policy = ladder.policy();
        assert!(!policy.may_demote(Duration::from_secs(59), Duration::from_secs(59)));
        assert!(policy.may_demote(Duration::from_secs(60), Duration::from_secs(10)));
        assert!(!policy.may_demote(Duration::from_secs(600), Duration::from_secs(9)));
    }
}
