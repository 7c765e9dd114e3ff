//! The tier policy: which tier a message or an I/O vector goes out on, when a connection asks
//! for a larger tier, when it segments, and when an idle connection steps back down.
//!
//! Everything here is sans-IO: the planners are pure functions of the ladder, the tier in
//! force and the lengths, and the `DemotionTracker` is told the time (`std::time::Instant`)
//! with every input instead of reading a clock. The owner, a connection's
//! [`TierController`](crate::controller::TierController), applies the plans: it asks the
//! negotiation for the tier a plan names, sends the message meanwhile in segments on the tier
//! in force (it never reports "0 bytes transferred" while a promotion is pending;
//! `docs/policy.md`), and arms a timer at `DemotionTracker::next_deadline`.
//!
//! # Invariants kept here
//!
//! - Every tier a plan names is on the ladder; a plan whose input tier is not on the ladder is
//!   an error ([`PolicyError::TierOutsideLadder`]), never a panic.
//! - A plan promotes only upward, and only when the message does not fit the tier in force;
//!   the tier a message is sent on admits it (`len <= promote_threshold`), or the message is
//!   segmented and every segment is at most that tier's threshold.
//! - Under `Promotion::Refused` no plan promotes: what does not fit is segmented on the tier
//!   in force.
//! - An I/O-vector prefix never holds more bytes than the tier in force admits, is maximal
//!   (the next element would not fit with it), and consumes at least one element of a
//!   non-empty vector; an element is promoted for only when it does not fit on its own.
//! - The tracker suggests only a tier below the one in force, never within the hysteresis of
//!   a tier change, never while a message that needed the tier in force (or a larger one) is
//!   more recent than `demote_after`, and never below a tier that a message of the last
//!   `demote_after` needed.

use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

#[cfg(test)]
use crate::TierError;
use crate::TierIndex;
use crate::wire::NackReason;

mod capacity;

pub use capacity::{CapacityError, FrameCapacity};

/// A policy input that does not fit the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A tier was named that the ladder does not have.
    #[error("{tier} is not on the ladder, whose top is {top}")]
    TierOutsideLadder {
        /// The tier named.
        tier: TierIndex,
        /// The ladder's top tier.
        top: TierIndex,
    },
}

/// Whether the connection may ask for a larger tier now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub(crate) enum Promotion {
    /// A promotion may be asked for.
    #[default]
    Allowed,
    /// The last promotion was refused and asking again now would be refused again: the peer
    /// nacked it as over budget (or past its ladder), or our own reservoir could not register
    /// the tier within the budget. What does not fit is segmented on the tier in force. When
    /// to allow promotion again (a later demotion, a freed budget, a back-off) is the owner's
    /// choice.
    Refused,
}

impl Promotion {
    /// What a nack from the peer means for the next plans: over budget and past the peer's
    /// ladder are refusals; a busy peer may be asked again.
    pub(crate) fn after_nack(reason: NackReason) -> Promotion {
        match reason {
            NackReason::OverBudget | NackReason::BeyondLadder => Promotion::Refused,
            NackReason::Busy => Promotion::Allowed,
        }
    }

    /// What a failure to provision a tier locally means for the next plans: a budget refusal
    /// ([`TierError::is_over_budget`]) is a refusal; anything else (another change under way,
    /// a driver failure) may pass on a later try.
    #[cfg(test)]
    pub(crate) fn after_register_error(error: &TierError) -> Promotion {
        if error.is_over_budget() {
            Promotion::Refused
        } else {
            Promotion::Allowed
        }
    }
}

/// How a message too long for one slot is cut: consecutive pieces of `segment_len` bytes, the
/// last one possibly shorter. Only the planners make one, always with at least two pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segments {
    message_len: usize,
    segment_len: usize,
}

impl Segments {
    /// Cuts `message_len` bytes into pieces of `segment_len`, a tier threshold, which the
    /// ladder's validation keeps non-zero.
    fn new(message_len: usize, segment_len: usize) -> Segments {
        Segments {
            message_len,
            segment_len,
        }
    }

    /// The length of the whole message.
    pub fn message_len(&self) -> usize {
        self.message_len
    }

    /// The length of every piece but the last: the threshold of the tier they are sent on.
    pub fn segment_len(&self) -> usize {
        self.segment_len
    }

    /// How many pieces there are.
    pub fn count(&self) -> usize {
        self.message_len.div_ceil(self.segment_len)
    }

    /// The byte range of the message each piece carries, in order; together they cover the
    /// message exactly once. The iterator knows its length and runs from both ends, so the
    /// last piece of a huge message is found without walking the others.
    pub fn ranges(self) -> impl DoubleEndedIterator<Item = Range<usize>> + ExactSizeIterator {
        let Segments {
            message_len,
            segment_len,
        } = self;
        (0..message_len)
            .step_by(segment_len)
            .map(move |start| start..start + segment_len.min(message_len - start))
    }
}

/// Why a message is segmented on the tier in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum SegmentCause {
    /// The message is longer than the top tier's threshold and the connection is on the top.
    AboveTop,
    /// A larger tier would carry the message in fewer pieces, but promotion is
    /// [`Promotion::Refused`].
    PromotionRefused {
        /// The tier the message would have been promoted to: the smallest that fits it, or
        /// the top when none does.
        wanted: TierIndex,
    },
}

/// What to do with one message, given the tier in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum MessagePlan {
    /// The message fits the tier in force: send it now as one message.
    Send {
        /// The tier in force.
        tier: TierIndex,
    },
    /// The message does not fit the tier in force: ask for a promotion to `to`, the smallest
    /// tier that fits it (any tier above, not only the next). The patent's sender sends
    /// nothing until the promotion completes ("0 bytes transferred"); the
    /// [`TierController`](crate::controller::TierController) sends this message in segments
    /// on the tier in force meanwhile.
    Promote {
        /// The tier to promote to.
        to: TierIndex,
    },
    /// The message is longer than the top tier's threshold and the connection is below the
    /// top: ask for a promotion to the top, then send the message as `segments` on it.
    PromoteThenSegment {
        /// The top tier.
        to: TierIndex,
        /// How the message is cut once on the top tier.
        segments: Segments,
    },
    /// Send the message now as `segments` on `tier`, the tier in force.
    Segment {
        /// The tier in force.
        tier: TierIndex,
        /// How the message is cut.
        segments: Segments,
        /// Why it is segmented instead of promoted.
        cause: SegmentCause,
    },
}

impl MessagePlan {
    /// The tier the message's bytes travel on: the tier in force, or the one promoted to.
    #[cfg(test)]
    pub(crate) fn tier(&self) -> TierIndex {
        match *self {
            MessagePlan::Send { tier } | MessagePlan::Segment { tier, .. } => tier,
            MessagePlan::Promote { to } | MessagePlan::PromoteThenSegment { to, .. } => to,
        }
    }

    /// How the message is cut, if it is segmented.
    #[cfg(test)]
    pub(crate) fn segments(&self) -> Option<Segments> {
        match *self {
            MessagePlan::Send { .. } | MessagePlan::Promote { .. } => None,
            MessagePlan::PromoteThenSegment { segments, .. }
            | MessagePlan::Segment { segments, .. } => Some(segments),
        }
    }
}

/// Plans one message of `len` bytes on the tier `current`.
///
/// A message that fits `current` is sent on it, even when a smaller tier would do: stepping
/// down is the [`DemotionTracker`]'s decision, not a message's. A zero-length message is a
/// message and fits every tier.
///
/// # Errors
///
/// [`PolicyError::TierOutsideLadder`] when `current` is not on the ladder.
pub(crate) fn plan_message(
    capacity: &FrameCapacity,
    current: TierIndex,
    len: usize,
    promotion: Promotion,
) -> Result<MessagePlan, PolicyError> {
    let threshold = threshold_of(capacity, current)?;
    if len <= threshold {
        return Ok(MessagePlan::Send { tier: current });
    }
    plan_oversized(capacity, current, threshold, len, promotion)
}

/// What to do with the next part of an I/O vector, given the tier in force (the prefix
/// rule, `docs/policy.md`, "I/O vectors", for one message per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum IoVecPlan {
    /// Send the first `elements` elements, `bytes` bytes together, now as one message on
    /// `tier`, the tier in force. The scan stopped before element `elements` (if there is one)
    /// because it would not fit together with them; the rest is for later calls. A vector
    /// with no bytes at all (empty, or only zero-length elements) is one zero-byte message,
    /// like [`plan_message`] with `len` 0; a non-empty vector always gives `elements >= 1`.
    SendPrefix {
        /// The tier in force.
        tier: TierIndex,
        /// How many leading elements the message carries.
        elements: usize,
        /// Their total length, at most the tier's threshold.
        bytes: usize,
    },
    /// Element `element`, the first with any bytes (those before it are zero-length), does not
    /// fit the tier in force on its own. `plan` is the plan for that element alone, never
    /// [`MessagePlan::Send`]: after a promotion nothing was sent and the vector is planned
    /// again on the new tier; a segmented element is sent now, and consumes the elements up to
    /// and including `element`.
    Oversized {
        /// The index of the element.
        element: usize,
        /// What to do with it.
        plan: MessagePlan,
    },
}

/// Plans the next message of an I/O vector on the tier `current`: the lengths of `elements`
/// given to [`plan_io_vector_lens`].
///
/// # Errors
///
/// [`PolicyError::TierOutsideLadder`] when `current` is not on the ladder.
pub(crate) fn plan_io_vector(
    capacity: &FrameCapacity,
    current: TierIndex,
    elements: &[IoSlice<'_>],
    promotion: Promotion,
) -> Result<IoVecPlan, PolicyError> {
    scan_io_vector(
        capacity,
        current,
        elements.iter().map(|element| element.len()),
        promotion,
    )
}

/// Plans the next message of an I/O vector whose element lengths are `lens`, on the tier
/// `current`: the prefix rule (`docs/policy.md`, "I/O vectors").
///
/// If the first element with any bytes does not fit the tier in force on its own, the vector
/// is [`IoVecPlan::Oversized`] (promote, or segment when past the top or refused). Otherwise
/// the longest run of leading elements whose lengths *together* fit the tier's threshold is
/// sent as one message, and the scan stops at the first element that does not fit with it;
/// that element is planned by the next call, on the same tier, where it comes first.
/// Zero-length elements cost nothing and join the run they are in.
///
/// # Errors
///
/// [`PolicyError::TierOutsideLadder`] when `current` is not on the ladder.
#[cfg(test)]
pub(crate) fn plan_io_vector_lens(
    capacity: &FrameCapacity,
    current: TierIndex,
    lens: &[usize],
    promotion: Promotion,
) -> Result<IoVecPlan, PolicyError> {
    scan_io_vector(capacity, current, lens.iter().copied(), promotion)
}

fn scan_io_vector(
    capacity: &FrameCapacity,
    current: TierIndex,
    lens: impl Iterator<Item = usize>,
    promotion: Promotion,
) -> Result<IoVecPlan, PolicyError> {
    let threshold = threshold_of(capacity, current)?;
    let mut elements = 0;
    let mut bytes = 0;
    for len in lens {
        // `bytes <= threshold` holds throughout, so the subtraction cannot wrap, and the
        // comparison cannot overflow however long the elements are.
        if len > threshold - bytes {
            if bytes == 0 {
                return Ok(IoVecPlan::Oversized {
                    element: elements,
                    plan: plan_oversized(capacity, current, threshold, len, promotion)?,
                });
            }
            break;
        }
        bytes += len;
        elements += 1;
    }
    Ok(IoVecPlan::SendPrefix {
        tier: current,
        elements,
        bytes,
    })
}

/// Plans a message of `len` bytes that does not fit `current`, whose threshold is
/// `threshold` (`len > threshold`).
fn plan_oversized(
    capacity: &FrameCapacity,
    current: TierIndex,
    threshold: usize,
    len: usize,
    promotion: Promotion,
) -> Result<MessagePlan, PolicyError> {
    let top = capacity.ladder().top();
    if current == top {
        return Ok(MessagePlan::Segment {
            tier: top,
            segments: Segments::new(len, threshold),
            cause: SegmentCause::AboveTop,
        });
    }
    let fitting = capacity.tier_for(len);
    Ok(match promotion {
        Promotion::Refused => MessagePlan::Segment {
            tier: current,
            segments: Segments::new(len, threshold),
            cause: SegmentCause::PromotionRefused {
                wanted: fitting.unwrap_or(top),
            },
        },
        Promotion::Allowed => match fitting {
            Some(to) => MessagePlan::Promote { to },
            None => MessagePlan::PromoteThenSegment {
                to: top,
                segments: Segments::new(len, threshold_of(capacity, top)?),
            },
        },
    })
}

/// The longest message `tier` carries whole ([`FrameCapacity::whole`]), or the error naming
/// the tier when it is not on the ladder.
fn threshold_of(capacity: &FrameCapacity, tier: TierIndex) -> Result<usize, PolicyError> {
    capacity.whole(tier).ok_or(PolicyError::TierOutsideLadder {
        tier,
        top: capacity.ladder().top(),
    })
}

/// Decides, for one direction of one connection, when it steps back down the ladder.
///
/// - **Need.** A message of `len` bytes *needs* the smallest tier that fits it
///   ([`FrameCapacity::needed_tier`]; a message past the top needs the top). A promotion to a
///   tier counts as a need of that tier at the moment it takes effect.
/// - **Idle.** The connection is idle once no message has needed the tier in force, or a
///   larger one, for the ladder's `demote_after` (the definition of
///   [`LadderPolicy::demote_after`](crate::ladder::LadderPolicy::demote_after)). Small
///   messages keep flowing on a promoted tier without keeping it promoted.
/// - **Hysteresis.** However idle, the connection stays at least `hysteresis` on a tier after
///   any change ([`LadderPolicy::may_demote`](crate::ladder::LadderPolicy::may_demote)).
/// - **Target.** The tier to demote to is the smallest that fits every message of the last
///   `demote_after`: a connection that still sends 2 KiB messages is not demoted below the
///   tier that fits 2 KiB, and one that went quiet goes down several tiers at once.
///
/// The tracker only suggests; the owner negotiates the demotion and reports it with
/// [`tier_changed`](Self::tier_changed). Until then [`poll`](Self::poll) keeps suggesting.
#[derive(Debug, Clone)]
pub(crate) struct DemotionTracker {
    capacity: Arc<FrameCapacity>,
    tier: TierIndex,
    on_tier_since: Instant,
    /// For each tier, the latest time a message (or a promotion) needed it.
    last_needed: Vec<Option<Instant>>,
}

impl DemotionTracker {
    /// A tracker for a connection that starts on the smallest tier at `now`.
    pub(crate) fn new(capacity: Arc<FrameCapacity>, now: Instant) -> DemotionTracker {
        let tiers = capacity.ladder().len();
        DemotionTracker {
            capacity,
            tier: TierIndex::SMALLEST,
            on_tier_since: now,
            last_needed: vec![None; tiers],
        }
    }

    /// The tier in force, as last reported.
    #[cfg(test)]
    pub(crate) fn tier(&self) -> TierIndex {
        self.tier
    }

    /// Records a message of `len` bytes at `now`, whatever tier it went out on (one segmented
    /// because a promotion was refused still needs the larger tier). Times earlier than one
    /// already recorded for the same tier are kept as the later one.
    pub(crate) fn record(&mut self, now: Instant, len: usize) {
        let needed = self.capacity.needed_tier(len);
        self.mark_needed(needed, now);
    }

    /// Reports that `tier` is in force from `now` (a promotion or a demotion took effect).
    /// Reporting the tier already in force changes nothing, so it does not restart the
    /// hysteresis.
    ///
    /// # Errors
    ///
    /// [`PolicyError::TierOutsideLadder`] when `tier` is not on the ladder; nothing changes.
    pub(crate) fn tier_changed(
        &mut self,
        now: Instant,
        tier: TierIndex,
    ) -> Result<(), PolicyError> {
        threshold_of(&self.capacity, tier)?;
        if tier == self.tier {
            return Ok(());
        }
        if tier > self.tier {
            self.mark_needed(tier, now);
        }
        self.tier = tier;
        self.on_tier_since = now;
        Ok(())
    }

    /// The tier to demote to at `now`, or `None` while the connection must stay where it is
    /// (not idle, within the hysteresis, or already on the smallest tier).
    pub(crate) fn poll(&self, now: Instant) -> Option<TierIndex> {
        let idle = now.saturating_duration_since(self.idle_since());
        let time_on_tier = now.saturating_duration_since(self.on_tier_since);
        if !self
            .capacity
            .ladder()
            .policy()
            .may_demote(time_on_tier, idle)
        {
            return None;
        }
        Some(self.window_tier(now)).filter(|&target| target < self.tier)
    }

    /// The earliest time at which [`poll`](Self::poll) can suggest a demotion if nothing more
    /// is recorded: when to arm the owner's timer. `None` on the smallest tier, or when that
    /// time is past what an `Instant` can hold.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        if self.tier == TierIndex::SMALLEST {
            return None;
        }
        let policy = self.capacity.ladder().policy();
        let idle_ends = self.idle_since().checked_add(policy.demote_after())?;
        let hysteresis_ends = self.on_tier_since.checked_add(policy.hysteresis())?;
        Some(idle_ends.max(hysteresis_ends))
    }

    fn mark_needed(&mut self, tier: TierIndex, now: Instant) {
        if let Some(last) = self.last_needed.get_mut(usize::from(tier.get())) {
            *last = Some(last.map_or(now, |seen| seen.max(now)));
        }
    }

    /// The latest need of the tier in force or a larger one; the time the tier took effect
    /// when there is none (a connection never promoted is on the smallest tier anyway).
    fn idle_since(&self) -> Instant {
        self.last_needed
            .iter()
            .skip(usize::from(self.tier.get()))
            .flatten()
            .max()
            .copied()
            .unwrap_or(self.on_tier_since)
    }

    /// The smallest tier that fits every message needed within the last `demote_after`
    /// before `now`.
    fn window_tier(&self, now: Instant) -> TierIndex {
        let demote_after = self.capacity.ladder().policy().demote_after();
        self.last_needed
            .iter()
            .rposition(|last| {
                last.is_some_and(|at| now.saturating_duration_since(at) < demote_after)
            })
            // The ladder has at most `MAX_TIERS` tiers, so every position fits a `u8`.
            .map_or(TierIndex::SMALLEST, |position| {
                TierIndex::new(position as u8)
            })
    }
}

#[cfg(test)]
mod examples;
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::ladder::TierLadder;

    const KIB: usize = 1024;

    /// A preset measured with no frame overhead: every tier carries its threshold whole.
    fn preset(name: &str) -> FrameCapacity {
        capacity_of(TierLadder::preset(name).unwrap())
    }

    fn capacity_of(ladder: TierLadder) -> FrameCapacity {
        FrameCapacity::new(Arc::new(ladder), 0).unwrap()
    }

    fn tier(index: u8) -> TierIndex {
        TierIndex::new(index)
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn segments_of(plan: MessagePlan) -> Vec<Range<usize>> {
        plan.segments().unwrap().ranges().collect()
    }

    // ---- message plans ----

    #[test]
    fn a_message_that_fits_the_tier_in_force_is_sent_on_it() {
        let ladder = preset("two-tier");
        for len in [0, 1, 479, 480] {
            assert_eq!(
                plan_message(&ladder, tier(0), len, Promotion::Allowed),
                Ok(MessagePlan::Send { tier: tier(0) })
            );
        }
        assert_eq!(
            plan_message(&ladder, tier(1), 10, Promotion::Allowed),
            Ok(MessagePlan::Send { tier: tier(1) }),
            "a small message does not demote"
        );
    }

    #[test]
    fn a_message_one_byte_over_promotes_to_the_next_tier() {
        let ladder = preset("two-tier");
        assert_eq!(
            plan_message(&ladder, tier(0), 481, Promotion::Allowed),
            Ok(MessagePlan::Promote { to: tier(1) })
        );
    }

    #[test]
    fn promotion_goes_straight_to_the_smallest_tier_that_fits() {
        let ladder = preset("rpc"); // 512, 8 KiB, 64 KiB
        assert_eq!(
            plan_message(&ladder, tier(0), 8 * KIB + 1, Promotion::Allowed),
            Ok(MessagePlan::Promote { to: tier(2) })
        );
        assert_eq!(
            plan_message(&ladder, tier(0), 8 * KIB, Promotion::Allowed),
            Ok(MessagePlan::Promote { to: tier(1) })
        );
        assert_eq!(
            plan_message(&ladder, tier(1), 64 * KIB, Promotion::Allowed),
            Ok(MessagePlan::Promote { to: tier(2) })
        );
    }

    #[test]
    fn a_message_past_the_top_promotes_to_the_top_then_segments() {
        let ladder = preset("rpc");
        let plan = plan_message(&ladder, tier(0), 150 * KIB, Promotion::Allowed).unwrap();
        let MessagePlan::PromoteThenSegment { to, segments } = plan else {
            panic!("unexpected {plan:?}");
        };
        assert_eq!(to, tier(2));
        assert_eq!(segments.segment_len(), 64 * KIB);
        assert_eq!(segments.count(), 3);
        assert_eq!(
            segments_of(plan),
            [0..64 * KIB, 64 * KIB..128 * KIB, 128 * KIB..150 * KIB]
        );
    }

    #[test]
    fn a_message_past_the_top_on_the_top_is_segmented_there() {
        let ladder = preset("two-tier");
        for promotion in [Promotion::Allowed, Promotion::Refused] {
            let plan = plan_message(&ladder, tier(1), 16 * KIB, promotion).unwrap();
            assert!(matches!(
                plan,
                MessagePlan::Segment { tier: t, cause: SegmentCause::AboveTop, .. } if t == tier(1)
            ));
            assert_eq!(segments_of(plan), [0..8 * KIB, 8 * KIB..16 * KIB]);
        }
    }

    #[test]
    fn a_refused_promotion_segments_on_the_tier_in_force() {
        let ladder = preset("rpc");
        let plan = plan_message(&ladder, tier(0), 2000, Promotion::Refused).unwrap();
        assert_eq!(
            plan,
            MessagePlan::Segment {
                tier: tier(0),
                segments: Segments::new(2000, 512),
                cause: SegmentCause::PromotionRefused { wanted: tier(1) },
            }
        );
        assert_eq!(plan.tier(), tier(0));
        assert_eq!(
            segments_of(plan),
            [0..512, 512..1024, 1024..1536, 1536..2000]
        );

        let past_top = plan_message(&ladder, tier(1), 100 * KIB, Promotion::Refused).unwrap();
        assert!(matches!(
            past_top,
            MessagePlan::Segment { tier: t, cause: SegmentCause::PromotionRefused { wanted }, .. }
                if t == tier(1) && wanted == tier(2)
        ));
        assert_eq!(past_top.segments().unwrap().count(), 13);
    }

    #[test]
    fn a_refusal_does_not_change_a_message_that_fits() {
        let ladder = preset("rpc");
        assert_eq!(
            plan_message(&ladder, tier(1), 8 * KIB, Promotion::Refused),
            Ok(MessagePlan::Send { tier: tier(1) })
        );
    }

    #[test]
    fn a_tier_off_the_ladder_is_an_error_not_a_panic() {
        let ladder = preset("two-tier");
        let expected = Err(PolicyError::TierOutsideLadder {
            tier: tier(2),
            top: tier(1),
        });
        assert_eq!(
            plan_message(&ladder, tier(2), 0, Promotion::Allowed),
            expected
        );
        assert_eq!(
            plan_io_vector_lens(&ladder, tier(2), &[], Promotion::Allowed),
            expected.map(|_: MessagePlan| unreachable!())
        );
        assert!(plan_message(&ladder, tier(255), usize::MAX, Promotion::Refused).is_err());
    }

    #[test]
    fn the_longest_message_is_segmented_without_overflow() {
        let ladder = preset("storage");
        let plan = plan_message(&ladder, tier(0), usize::MAX, Promotion::Allowed).unwrap();
        let segments = plan.segments().unwrap();
        assert_eq!(segments.count(), usize::MAX.div_ceil(1 << 20));
        assert_eq!(segments.ranges().len(), segments.count());
        let last = segments.ranges().next_back().unwrap();
        assert_eq!(last.end, usize::MAX);
        assert_eq!(last.len(), usize::MAX % (1 << 20));
    }

    #[test]
    fn nacks_and_local_errors_map_to_refusals_only_for_budget_and_ladder() {
        assert_eq!(
            Promotion::after_nack(NackReason::OverBudget),
            Promotion::Refused
        );
        assert_eq!(Promotion::after_nack(NackReason::Busy), Promotion::Allowed);
        let already_on = TierError::AlreadyOn { tier: tier(1) };
        assert_eq!(
            Promotion::after_register_error(&already_on),
            Promotion::Allowed
        );
    }

    // ---- I/O-vector plans ----

    fn iovec(ladder: &FrameCapacity, current: u8, lens: &[usize]) -> IoVecPlan {
        plan_io_vector_lens(ladder, tier(current), lens, Promotion::Allowed).unwrap()
    }

    fn prefix(current: u8, elements: usize, bytes: usize) -> IoVecPlan {
        IoVecPlan::SendPrefix {
            tier: tier(current),
            elements,
            bytes,
        }
    }

    #[test]
    fn an_empty_vector_is_one_zero_byte_message() {
        assert_eq!(iovec(&preset("two-tier"), 0, &[]), prefix(0, 0, 0));
    }

    #[test]
    fn a_vector_of_zero_length_elements_is_consumed_as_one_zero_byte_message() {
        assert_eq!(iovec(&preset("two-tier"), 0, &[0, 0, 0]), prefix(0, 3, 0));
    }

    #[test]
    fn a_vector_that_fits_together_is_one_message() {
        assert_eq!(
            iovec(&preset("two-tier"), 0, &[100, 0, 200, 180]),
            prefix(0, 4, 480)
        );
    }

    #[test]
    fn the_prefix_stops_at_the_first_element_that_does_not_fit_with_it() {
        let ladder = preset("two-tier");
        assert_eq!(
            iovec(&ladder, 0, &[100, 2000, 10]),
            prefix(0, 1, 100),
            "the small elements go out before the large one promotes"
        );
        assert_eq!(
            iovec(&ladder, 0, &[300, 300, 10]),
            prefix(0, 1, 300),
            "an element that fits alone but not with the prefix waits for the next call"
        );
        assert_eq!(
            iovec(&ladder, 0, &[300, 0, 0, 300]),
            prefix(0, 3, 300),
            "zero-length elements join the run they are in"
        );
    }

    #[test]
    fn a_first_element_too_large_promotes_and_sends_nothing() {
        let ladder = preset("rpc");
        assert_eq!(
            iovec(&ladder, 0, &[10_000, 10]),
            IoVecPlan::Oversized {
                element: 0,
                plan: MessagePlan::Promote { to: tier(2) }
            }
        );
        assert_eq!(
            iovec(&ladder, 0, &[0, 0, 600]),
            IoVecPlan::Oversized {
                element: 2,
                plan: MessagePlan::Promote { to: tier(1) }
            },
            "leading zero-length elements do not make a message of their own"
        );
        assert_eq!(
            iovec(&ladder, 2, &[10_000, 10]),
            prefix(2, 2, 10_010),
            "once promoted the whole vector fits"
        );
    }

    #[test]
    fn a_first_element_past_the_top_promotes_to_the_top_or_segments_there() {
        let ladder = preset("two-tier");
        assert_eq!(
            iovec(&ladder, 0, &[9000]),
            IoVecPlan::Oversized {
                element: 0,
                plan: MessagePlan::PromoteThenSegment {
                    to: tier(1),
                    segments: Segments::new(9000, 8 * KIB)
                }
            }
        );
        assert_eq!(
            iovec(&ladder, 1, &[9000, 1]),
            IoVecPlan::Oversized {
                element: 0,
                plan: MessagePlan::Segment {
                    tier: tier(1),
                    segments: Segments::new(9000, 8 * KIB),
                    cause: SegmentCause::AboveTop
                }
            }
        );
    }

    #[test]
    fn a_refused_vector_segments_its_first_element_on_the_tier_in_force() {
        let ladder = preset("two-tier");
        assert_eq!(
            plan_io_vector_lens(&ladder, tier(0), &[0, 1000], Promotion::Refused),
            Ok(IoVecPlan::Oversized {
                element: 1,
                plan: MessagePlan::Segment {
                    tier: tier(0),
                    segments: Segments::new(1000, 480),
                    cause: SegmentCause::PromotionRefused { wanted: tier(1) }
                }
            })
        );
    }

    #[test]
    fn huge_elements_do_not_overflow_the_scan() {
        let ladder = preset("two-tier");
        assert_eq!(
            iovec(&ladder, 1, &[8 * KIB, usize::MAX, usize::MAX]),
            prefix(1, 1, 8 * KIB)
        );
        assert!(matches!(
            iovec(&ladder, 1, &[usize::MAX]),
            IoVecPlan::Oversized { element: 0, .. }
        ));
    }

    #[test]
    fn io_slices_and_lengths_plan_alike() {
        let ladder = preset("two-tier");
        let buffers = [vec![0u8; 100], vec![], vec![0u8; 300], vec![0u8; 200]];
        let slices: Vec<IoSlice<'_>> = buffers.iter().map(|b| IoSlice::new(b)).collect();
        let lens: Vec<usize> = buffers.iter().map(Vec::len).collect();
        for current in [0, 1] {
            assert_eq!(
                plan_io_vector(&ladder, tier(current), &slices, Promotion::Allowed),
                plan_io_vector_lens(&ladder, tier(current), &lens, Promotion::Allowed)
            );
        }
    }

    // ---- demotion ----

    /// A three-tier ladder (thresholds 512, 4 KiB, 64 KiB) with 10 s idle and 2 s hysteresis.
    fn three_tiers() -> Arc<FrameCapacity> {
        Arc::new(capacity_of(
            TierLadder::builder()
                .tier(512, 8, 512)
                .tier(4 * KIB, 8, 4 * KIB)
                .tier(64 * KIB, 4, 64 * KIB)
                .demote_after(secs(10))
                .hysteresis(secs(2))
                .build()
                .unwrap(),
        ))
    }

    #[test]
    fn the_smallest_tier_is_never_demoted() {
        let start = Instant::now();
        let tracker = DemotionTracker::new(three_tiers(), start);
        assert_eq!(tracker.poll(start + secs(1000)), None);
        assert_eq!(tracker.next_deadline(), None);
    }

    #[test]
    fn an_idle_connection_is_demoted_at_its_deadline_and_not_before() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.record(start, 2000);
        tracker.tier_changed(start + ms(100), tier(1)).unwrap();
        let deadline = tracker.next_deadline().unwrap();
        assert_eq!(
            deadline,
            start + ms(10_100),
            "idle counts from the promotion"
        );
        assert_eq!(tracker.poll(deadline - ms(1)), None);
        assert_eq!(tracker.poll(deadline), Some(tier(0)));
        assert_eq!(tracker.poll(deadline + secs(100)), Some(tier(0)));
    }

    #[test]
    fn messages_that_need_the_tier_postpone_demotion_and_small_ones_do_not() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(1)).unwrap();
        tracker.record(start + secs(8), 1000);
        assert_eq!(tracker.next_deadline(), Some(start + secs(18)));
        tracker.record(start + secs(9), 100);
        tracker.record(start + secs(17), 512);
        assert_eq!(tracker.next_deadline(), Some(start + secs(18)));
        assert_eq!(tracker.poll(start + secs(18)), Some(tier(0)));
    }

    #[test]
    fn a_message_larger_than_the_tier_keeps_it_too() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(1)).unwrap();
        // Sent segmented on tier 1 after a refusal: it still needed more than tier 1.
        tracker.record(start + secs(5), 1 << 20);
        assert_eq!(tracker.poll(start + secs(14)), None);
        assert_eq!(tracker.poll(start + secs(15)), Some(tier(0)));
    }

    #[test]
    fn the_target_fits_every_message_of_the_window() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(2)).unwrap();
        tracker.record(start + secs(6), 2 * KIB);
        assert_eq!(tracker.poll(start + secs(10)), Some(tier(1)));
        assert_eq!(
            tracker.poll(start + secs(16)),
            Some(tier(0)),
            "several tiers at once once the window is empty"
        );
    }

    #[test]
    fn hysteresis_holds_a_demoted_connection_on_its_new_tier() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(2)).unwrap();
        tracker.record(start + secs(1), 2 * KIB);
        tracker.tier_changed(start + secs(10), tier(1)).unwrap();
        // Idle on tier 1 since second 11, but the change at second 10 holds it until 12.
        assert_eq!(tracker.poll(start + secs(11)), None);
        assert_eq!(tracker.next_deadline(), Some(start + secs(12)));
        assert_eq!(tracker.poll(start + secs(12)), Some(tier(0)));
    }

    #[test]
    fn hysteresis_longer_than_the_idle_time_decides_the_deadline() {
        let ladder = Arc::new(capacity_of(
            TierLadder::builder()
                .tier(512, 8, 512)
                .tier(4 * KIB, 8, 4 * KIB)
                .demote_after(secs(1))
                .hysteresis(secs(30))
                .build()
                .unwrap(),
        ));
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(ladder, start);
        tracker.tier_changed(start, tier(1)).unwrap();
        assert_eq!(tracker.poll(start + secs(29)), None);
        assert_eq!(tracker.next_deadline(), Some(start + secs(30)));
        assert_eq!(tracker.poll(start + secs(30)), Some(tier(0)));
    }

    #[test]
    fn reporting_the_same_tier_again_does_not_restart_the_hysteresis() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(1)).unwrap();
        tracker.tier_changed(start + secs(9), tier(1)).unwrap();
        assert_eq!(tracker.poll(start + secs(10)), Some(tier(0)));
    }

    #[test]
    fn a_tier_off_the_ladder_leaves_the_tracker_unchanged() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start);
        tracker.tier_changed(start, tier(1)).unwrap();
        assert_eq!(
            tracker.tier_changed(start + secs(5), tier(3)),
            Err(PolicyError::TierOutsideLadder {
                tier: tier(3),
                top: tier(2)
            })
        );
        assert_eq!(tracker.tier(), tier(1));
        assert_eq!(tracker.next_deadline(), Some(start + secs(10)));
    }

    #[test]
    fn times_out_of_order_do_not_panic_or_move_needs_backwards() {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(three_tiers(), start + secs(100));
        tracker.tier_changed(start + secs(100), tier(1)).unwrap();
        tracker.record(start + secs(105), 1000);
        tracker.record(start, 1000);
        assert_eq!(tracker.next_deadline(), Some(start + secs(115)));
        assert_eq!(tracker.poll(start), None);
    }

    /// Drives a tracker as a connection would: plan each message, promote when the plan
    /// says so, record it, then demote when the tracker says so. Returns the tier changes.
    fn drive(ladder: &Arc<FrameCapacity>, messages: &[(Duration, usize)]) -> Vec<TierIndex> {
        let start = Instant::now();
        let mut tracker = DemotionTracker::new(ladder.clone(), start);
        let mut changes = Vec::new();
        for &(offset, len) in messages {
            let now = start + offset;
            if let Some(to) = tracker.poll(now) {
                tracker.tier_changed(now, to).unwrap();
                changes.push(to);
            }
            let plan = plan_message(ladder, tracker.tier(), len, Promotion::Allowed).unwrap();
            if let MessagePlan::Promote { to } | MessagePlan::PromoteThenSegment { to, .. } = plan {
                tracker.tier_changed(now, to).unwrap();
                changes.push(to);
            }
            tracker.record(now, len);
        }
        changes
    }

    #[test]
    fn a_connection_alternating_sizes_does_not_flap() {
        let ladder = Arc::new(preset("two-tier"));
        let messages: Vec<(Duration, usize)> = (0..600)
            .map(|second| (secs(second), if second % 2 == 0 { 100 } else { 5000 }))
            .collect();
        assert_eq!(drive(&ladder, &messages), [tier(1)]);
    }

    #[test]
    fn a_connection_with_rare_bursts_changes_tier_once_per_burst_each_way() {
        let ladder = three_tiers(); // 10 s idle
        let messages: Vec<(Duration, usize)> = (0..120)
            .map(|second| {
                let burst = second % 40 < 3;
                (secs(second), if burst { 3000 } else { 64 })
            })
            .collect();
        assert_eq!(
            drive(&ladder, &messages),
            [tier(1), tier(0), tier(1), tier(0), tier(1), tier(0)]
        );
    }

    // ---- properties ----

    /// Ladders of 1 to 5 tiers: tier sizes grow by at least 64 bytes, thresholds sit up to
    /// 63 bytes under them (so they grow too), so a tier's whole capacity is sometimes its
    /// size and sometimes less; measured with a frame overhead of 0 to 32 bytes, which the
    /// slots' headroom holds.
    fn ladders() -> impl Strategy<Value = FrameCapacity> {
        (
            prop::collection::vec((1usize..64, 0usize..64), 1..=5),
            0usize..=32,
        )
            .prop_map(|(steps, overhead)| {
                let mut builder = TierLadder::builder();
                let mut slot_size = 0;
                for (growth, slack) in steps {
                    slot_size += growth * 64;
                    builder = builder.tier(slot_size, 3, slot_size - slack);
                }
                let ladder = builder.build().expect("generated ladders are valid");
                FrameCapacity::new(Arc::new(ladder), overhead).expect("the headroom holds 32 bytes")
            })
    }

    fn lens() -> impl Strategy<Value = usize> {
        prop_oneof![4 => 0usize..20_000, 1 => Just(0), 1 => any::<usize>()]
    }

    fn promotions() -> impl Strategy<Value = Promotion> {
        prop_oneof![Just(Promotion::Allowed), Just(Promotion::Refused)]
    }

    fn threshold(capacity: &FrameCapacity, index: TierIndex) -> usize {
        capacity.whole(index).unwrap()
    }

    fn assert_segments_cover(segments: Segments, len: usize, limit: usize) {
        assert_eq!(segments.message_len(), len);
        assert!(segments.segment_len() <= limit);
        assert!(segments.count() >= 2);
        let mut ranges = segments.ranges();
        assert_eq!(ranges.len(), segments.count());
        // Lengths near usize::MAX make billions of pieces: check both ends and the lengths.
        let (first, last) = (ranges.next().unwrap(), ranges.next_back().unwrap());
        assert_eq!(first, 0..segments.segment_len());
        assert_eq!(last.end, len);
        assert!(!last.is_empty() && last.len() <= limit);
        assert_eq!(last.start, (segments.count() - 1) * segments.segment_len());
    }

    proptest! {
        #[test]
        fn plans_stay_on_the_ladder_go_up_only_and_admit_the_message(
            ladder in ladders(),
            current in 0u8..5,
            len in lens(),
            promotion in promotions(),
        ) {
            let current = TierIndex::new(current);
            let Ok(plan) = plan_message(&ladder, current, len, promotion) else {
                prop_assert!(ladder.whole(current).is_none());
                return Ok(());
            };
            let fits_current = len <= threshold(&ladder, current);
            match plan {
                MessagePlan::Send { tier } => {
                    prop_assert_eq!(tier, current);
                    prop_assert!(fits_current);
                }
                MessagePlan::Promote { to } => {
                    prop_assert_eq!(promotion, Promotion::Allowed);
                    prop_assert!(to > current && to <= ladder.ladder().top());
                    prop_assert!(len <= threshold(&ladder, to));
                    prop_assert!(len > threshold(&ladder, TierIndex::new(to.get() - 1)), "smallest fit");
                }
                MessagePlan::PromoteThenSegment { to, segments } => {
                    prop_assert_eq!(promotion, Promotion::Allowed);
                    prop_assert!(to > current);
                    prop_assert_eq!(to, ladder.ladder().top());
                    prop_assert!(len > threshold(&ladder, to));
                    assert_segments_cover(segments, len, threshold(&ladder, to));
                }
                MessagePlan::Segment { tier, segments, cause } => {
                    prop_assert_eq!(tier, current);
                    prop_assert!(!fits_current);
                    match cause {
                        SegmentCause::AboveTop => prop_assert_eq!(current, ladder.ladder().top()),
                        SegmentCause::PromotionRefused { wanted } => {
                            prop_assert_eq!(promotion, Promotion::Refused);
                            prop_assert!(wanted > current && wanted <= ladder.ladder().top());
                        }
                    }
                    assert_segments_cover(segments, len, threshold(&ladder, tier));
                }
            }
        }

        #[test]
        fn io_vector_prefixes_fit_are_maximal_and_make_progress(
            ladder in ladders(),
            current in 0u8..5,
            lens in prop::collection::vec(lens(), 0..12),
            promotion in promotions(),
        ) {
            let current = TierIndex::new(current);
            let Some(limit) = ladder.whole(current) else {
                prop_assert!(plan_io_vector_lens(&ladder, current, &lens, promotion).is_err());
                return Ok(());
            };
            match plan_io_vector_lens(&ladder, current, &lens, promotion).unwrap() {
                IoVecPlan::SendPrefix { tier, elements, bytes } => {
                    prop_assert_eq!(tier, current);
                    prop_assert!(bytes <= limit);
                    prop_assert_eq!(bytes, lens[..elements].iter().sum::<usize>());
                    prop_assert!(elements >= 1 || lens.is_empty());
                    if let Some(&next) = lens.get(elements) {
                        prop_assert!(next > limit - bytes, "the prefix is maximal");
                        prop_assert!(bytes > 0, "no zero-byte message before a large element");
                    }
                }
                IoVecPlan::Oversized { element, plan } => {
                    prop_assert!(lens[..element].iter().all(|&len| len == 0));
                    prop_assert!(lens[element] > limit);
                    prop_assert_eq!(Ok(plan), plan_message(&ladder, current, lens[element], promotion));
                }
            }
        }

        #[test]
        fn the_tracker_demotes_only_idle_connections_off_hysteresis_and_not_below_the_window(
            demote_after_ms in 1u64..2000,
            hysteresis_ms in 0u64..2000,
            steps in prop::collection::vec((0u64..800, 0u8..4, 0usize..70_000), 1..60),
        ) {
            let ladder = Arc::new(capacity_of(
                TierLadder::builder()
                    .tier(512, 3, 512)
                    .tier(4 * KIB, 3, 4 * KIB)
                    .tier(64 * KIB, 3, 64 * KIB)
                    .demote_after(ms(demote_after_ms))
                    .hysteresis(ms(hysteresis_ms))
                    .build()
                    .unwrap(),
            ));
            let (demote_after, hysteresis) = (ms(demote_after_ms), ms(hysteresis_ms));
            let start = Instant::now();
            let mut tracker = DemotionTracker::new(ladder.clone(), start);
            let mut now = start;
            let mut changed_at = start;
            let mut current = TierIndex::SMALLEST;
            // Every need so far: (time, tier needed), promotions included.
            let mut needs: Vec<(Instant, TierIndex)> = Vec::new();
            for (advance, action, len) in steps {
                now += ms(advance);
                match action {
                    0 | 1 => {
                        tracker.record(now, len);
                        needs.push((now, ladder.ladder().tier_for_len(len).unwrap_or(ladder.ladder().top())));
                    }
                    2 => {
                        let to = TierIndex::new((len % 5) as u8);
                        let result = tracker.tier_changed(now, to);
                        prop_assert_eq!(result.is_ok(), ladder.ladder().tier(to).is_some());
                        if result.is_ok() && to != current {
                            if to > current {
                                needs.push((now, to));
                            }
                            current = to;
                            changed_at = now;
                        }
                    }
                    _ => {
                        if let Some(to) = tracker.poll(now) {
                            tracker.tier_changed(now, to).unwrap();
                            current = to;
                            changed_at = now;
                        }
                    }
                }
                prop_assert_eq!(tracker.tier(), current);
                let suggestion = tracker.poll(now);
                let in_window = |&&(at, _): &&(Instant, TierIndex)| now.duration_since(at) < demote_after;
                let busy = needs.iter().filter(in_window).any(|&(_, needed)| needed >= current);
                let window_tier = needs.iter().filter(in_window).map(|&(_, needed)| needed).max();
                let held = now.duration_since(changed_at) < hysteresis;
                match suggestion {
                    Some(target) => {
                        prop_assert!(target < current);
                        prop_assert!(!held, "within the hysteresis");
                        prop_assert!(!busy, "activity needing the tier is recent");
                        prop_assert_eq!(target, window_tier.unwrap_or(TierIndex::SMALLEST));
                    }
                    None => prop_assert!(current == TierIndex::SMALLEST || held || busy, "a due demotion was missed"),
                }
                if let Some(deadline) = tracker.next_deadline() {
                    prop_assert_eq!(tracker.poll(deadline).is_some(), true, "the deadline is due");
                    if deadline > now {
                        prop_assert_eq!(suggestion, None, "nothing is due before the deadline");
                    }
                } else {
                    prop_assert_eq!(current, TierIndex::SMALLEST);
                }
            }
        }

        #[test]
        fn a_connection_whose_large_messages_come_within_the_idle_time_stays_promoted(
            gaps_ms in prop::collection::vec(1u64..1000, 1..50),
            small in 0usize..=512,
        ) {
            let ladder = Arc::new(capacity_of(
                TierLadder::builder()
                    .tier(512, 3, 512)
                    .tier(4 * KIB, 3, 4 * KIB)
                    .demote_after(ms(1000))
                    .hysteresis(ms(100))
                    .build()
                    .unwrap(),
            ));
            let mut messages = Vec::new();
            let mut at = Duration::ZERO;
            for gap in gaps_ms {
                messages.push((at, 4 * KIB));
                messages.push((at + ms(gap / 2), small));
                at += ms(gap);
            }
            prop_assert_eq!(drive(&ladder, &messages), [TierIndex::new(1)]);
        }
    }
}
