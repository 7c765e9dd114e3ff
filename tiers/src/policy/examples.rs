//! The examples of `policy`'s crate-private items, run as tests: rustdoc cannot run
//! an example that names an item outside the public API.

/// The example of `policy::PolicyError`.
#[test]
fn policy_error_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, PolicyError, Promotion, plan_message};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let err = plan_message(&capacity, TierIndex::new(5), 100, Promotion::Allowed).unwrap_err();
    assert_eq!(
        err,
        PolicyError::TierOutsideLadder {
            tier: TierIndex::new(5),
            top: TierIndex::new(1)
        }
    );
    assert_eq!(
        err.to_string(),
        "tier 5 is not on the ladder, whose top is tier 1"
    );
    Ok(())
}

/// The example of `policy::Promotion`.
#[test]
fn promotion_example() {
    use crate::policy::Promotion;
    assert_eq!(Promotion::default(), Promotion::Allowed);
}

/// The example of `policy::Promotion::after_nack`.
#[test]
fn promotion_after_nack_example() {
    use crate::policy::Promotion;
    use crate::wire::NackReason;
    assert_eq!(
        Promotion::after_nack(NackReason::OverBudget),
        Promotion::Refused
    );
    assert_eq!(
        Promotion::after_nack(NackReason::BeyondLadder),
        Promotion::Refused
    );
    assert_eq!(Promotion::after_nack(NackReason::Busy), Promotion::Allowed);
}

/// The example of `policy::Segments`.
#[test]
fn segments_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, MessagePlan, Promotion, plan_message};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?; // top threshold 8192
    let top = TierIndex::new(1);
    let MessagePlan::Segment { segments, .. } =
        plan_message(&capacity, top, 20_000, Promotion::Allowed)?
    else {
        unreachable!("longer than the top tier");
    };
    assert_eq!(
        (
            segments.message_len(),
            segments.segment_len(),
            segments.count()
        ),
        (20_000, 8192, 3)
    );
    Ok(())
}

/// The example of `policy::Segments::message_len`.
#[test]
fn segments_message_len_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{TierIndex, ladder::TierLadder, policy::*};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 1000, Promotion::Refused)?;
    assert_eq!(plan.segments().map(|s| s.message_len()), Some(1000));
    Ok(())
}

/// The example of `policy::Segments::segment_len`.
#[test]
fn segments_segment_len_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{TierIndex, ladder::TierLadder, policy::*};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 1000, Promotion::Refused)?;
    assert_eq!(plan.segments().map(|s| s.segment_len()), Some(480));
    Ok(())
}

/// The example of `policy::Segments::count`.
#[test]
fn segments_count_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{TierIndex, ladder::TierLadder, policy::*};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 1000, Promotion::Refused)?;
    assert_eq!(plan.segments().map(|s| s.count()), Some(3)); // 480 + 480 + 40
    Ok(())
}

/// The example of `policy::Segments::ranges`.
#[test]
fn segments_ranges_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{TierIndex, ladder::TierLadder, policy::*};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 1000, Promotion::Refused)?;
    let ranges: Vec<_> = plan.segments().unwrap().ranges().collect();
    assert_eq!(ranges, [0..480, 480..960, 960..1000]);
    assert_eq!(
        plan.segments().unwrap().ranges().next_back(),
        Some(960..1000)
    );
    Ok(())
}

/// The example of `policy::SegmentCause`.
#[test]
fn segment_cause_example() {
    use crate::TierIndex;
    use crate::policy::SegmentCause;
    let cause = SegmentCause::PromotionRefused {
        wanted: TierIndex::new(1),
    };
    assert_ne!(cause, SegmentCause::AboveTop);
}

/// The example of `policy::MessagePlan`.
#[test]
fn message_plan_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, MessagePlan, Promotion, plan_message};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("rpc")?), 0)?; // thresholds 512, 8 KiB, 64 KiB
    let small = TierIndex::SMALLEST;
    assert_eq!(
        plan_message(&capacity, small, 512, Promotion::Allowed)?,
        MessagePlan::Send { tier: small }
    );
    assert_eq!(
        plan_message(&capacity, small, 10_000, Promotion::Allowed)?,
        MessagePlan::Promote {
            to: TierIndex::new(2)
        },
        "straight to the tier that fits, skipping tier 1",
    );
    Ok(())
}

/// The example of `policy::plan_message`.
#[test]
fn plan_message_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, MessagePlan, Promotion, SegmentCause, plan_message};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?; // thresholds 480 and 8192
    let (small, top) = (TierIndex::SMALLEST, TierIndex::new(1));
    assert_eq!(
        plan_message(&capacity, small, 480, Promotion::Allowed)?,
        MessagePlan::Send { tier: small }
    );
    assert_eq!(
        plan_message(&capacity, small, 481, Promotion::Allowed)?,
        MessagePlan::Promote { to: top }
    );
    let refused = plan_message(&capacity, small, 481, Promotion::Refused)?;
    assert!(matches!(
        refused,
        MessagePlan::Segment { tier, cause: SegmentCause::PromotionRefused { wanted }, .. } if tier == small && wanted == top
    ));
    Ok(())
}

/// The example of `policy::IoVecPlan`.
#[test]
fn io_vec_plan_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, IoVecPlan, Promotion, plan_io_vector_lens};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?; // threshold 480 on tier 0
    let plan = plan_io_vector_lens(
        &capacity,
        TierIndex::SMALLEST,
        &[200, 200, 200],
        Promotion::Allowed,
    )?;
    assert_eq!(
        plan,
        IoVecPlan::SendPrefix {
            tier: TierIndex::SMALLEST,
            elements: 2,
            bytes: 400
        }
    );
    Ok(())
}

/// The example of `policy::plan_io_vector`.
#[test]
fn plan_io_vector_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, IoVecPlan, Promotion, plan_io_vector};
    use std::io::IoSlice;
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let (header, body) = ([0u8; 64], vec![0u8; 4000]);
    let vector = [IoSlice::new(&header), IoSlice::new(&body)];
    assert_eq!(
        plan_io_vector(&capacity, TierIndex::SMALLEST, &vector, Promotion::Allowed)?,
        IoVecPlan::SendPrefix {
            tier: TierIndex::SMALLEST,
            elements: 1,
            bytes: 64
        },
        "the small header goes first; the body promotes on the next call",
    );
    Ok(())
}

/// The example of `policy::DemotionTracker`.
#[test]
fn demotion_tracker_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{DemotionTracker, FrameCapacity};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let ladder = Arc::new(TierLadder::preset("two-tier")?); // 60 s idle, 5 s hysteresis
    let start = Instant::now();
    let at = |secs| start + Duration::from_secs(secs);
    let mut tracker = DemotionTracker::new(Arc::new(FrameCapacity::new(ladder, 0)?), start);
    tracker.record(at(0), 4096);
    tracker.tier_changed(at(0), TierIndex::new(1))?;
    tracker.record(at(30), 100); // small messages do not keep tier 1
    assert_eq!(tracker.next_deadline(), Some(at(60)));
    assert_eq!(tracker.poll(at(59)), None);
    assert_eq!(tracker.poll(at(60)), Some(TierIndex::SMALLEST));
    Ok(())
}

/// The example of `policy::DemotionTracker::new`.
#[test]
fn demotion_tracker_new_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{
        TierIndex,
        ladder::TierLadder,
        policy::{DemotionTracker, FrameCapacity},
    };
    use std::{sync::Arc, time::Instant};
    let tracker = DemotionTracker::new(
        Arc::new(FrameCapacity::new(Arc::new(TierLadder::preset("rpc")?), 0)?),
        Instant::now(),
    );
    assert_eq!(tracker.tier(), TierIndex::SMALLEST);
    Ok(())
}

/// The example of `policy::DemotionTracker::record`.
#[test]
fn demotion_tracker_record_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{
        TierIndex,
        ladder::TierLadder,
        policy::{DemotionTracker, FrameCapacity},
    };
    use std::{
        sync::Arc,
        time::{Duration, Instant},
    };
    let ladder = Arc::new(TierLadder::preset("two-tier")?); // 60 s idle
    let start = Instant::now();
    let mut tracker = DemotionTracker::new(Arc::new(FrameCapacity::new(ladder, 0)?), start);
    tracker.tier_changed(start, TierIndex::new(1))?;
    tracker.record(start + Duration::from_secs(50), 8000);
    assert_eq!(
        tracker.next_deadline(),
        Some(start + Duration::from_secs(110))
    );
    Ok(())
}

/// The example of `policy::DemotionTracker::tier_changed`.
#[test]
fn demotion_tracker_tier_changed_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{TierIndex, ladder::TierLadder, policy::*};
    use std::{sync::Arc, time::Instant};
    let mut tracker = DemotionTracker::new(
        Arc::new(FrameCapacity::new(
            Arc::new(TierLadder::preset("two-tier")?),
            0,
        )?),
        Instant::now(),
    );
    tracker.tier_changed(Instant::now(), TierIndex::new(1))?;
    let err = tracker
        .tier_changed(Instant::now(), TierIndex::new(2))
        .unwrap_err();
    assert!(matches!(err, PolicyError::TierOutsideLadder { .. }));
    assert_eq!(tracker.tier(), TierIndex::new(1));
    Ok(())
}

/// The example of `policy::DemotionTracker::poll`.
#[test]
fn demotion_tracker_poll_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{
        TierIndex,
        ladder::TierLadder,
        policy::{DemotionTracker, FrameCapacity},
    };
    use std::{
        sync::Arc,
        time::{Duration, Instant},
    };
    let ladder = Arc::new(TierLadder::preset("rpc")?); // 512 B, 8 KiB, 64 KiB; 10 s idle
    let start = Instant::now();
    let at = |secs| start + Duration::from_secs(secs);
    let mut tracker = DemotionTracker::new(Arc::new(FrameCapacity::new(ladder, 0)?), start);
    tracker.tier_changed(at(0), TierIndex::new(2))?;
    tracker.record(at(5), 2048); // still needs tier 1
    assert_eq!(tracker.poll(at(10)), Some(TierIndex::new(1)));
    assert_eq!(
        tracker.poll(at(15)),
        Some(TierIndex::SMALLEST),
        "the 2 KiB message is old now"
    );
    Ok(())
}

/// The example of `policy::DemotionTracker::next_deadline`.
#[test]
fn demotion_tracker_next_deadline_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::{
        TierIndex,
        ladder::TierLadder,
        policy::{DemotionTracker, FrameCapacity},
    };
    use std::{
        sync::Arc,
        time::{Duration, Instant},
    };
    let ladder = Arc::new(TierLadder::preset("two-tier")?); // 60 s idle, 5 s hysteresis
    let start = Instant::now();
    let mut tracker = DemotionTracker::new(Arc::new(FrameCapacity::new(ladder, 0)?), start);
    assert_eq!(tracker.next_deadline(), None);
    tracker.tier_changed(start, TierIndex::new(1))?;
    assert_eq!(
        tracker.next_deadline(),
        Some(start + Duration::from_secs(60))
    );
    Ok(())
}

/// The example of `policy::Promotion::after_register_error`.
#[test]
fn promotion_after_register_error_example() {
    use crate::policy::Promotion;
    use crate::{TierError, TierIndex};
    use tierbuf_pool::MemoryBudget;
    let source = MemoryBudget::with_cap(4096).reserve(8192).unwrap_err();
    let over_budget = TierError::Register {
        tier: TierIndex::new(1),
        source,
    };
    assert_eq!(
        Promotion::after_register_error(&over_budget),
        Promotion::Refused
    );
    let busy = TierError::ChangePending {
        pending: TierIndex::new(1),
    };
    assert_eq!(Promotion::after_register_error(&busy), Promotion::Allowed);
}

/// The examples of `policy::MessagePlan::tier` and `policy::MessagePlan::segments`.
#[test]
fn message_plan_tier_and_segments_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, Promotion, plan_message};
    use std::sync::Arc;
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 4096, Promotion::Allowed)?;
    assert_eq!(plan.tier(), TierIndex::new(1));
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 4096, Promotion::Refused)?;
    assert_eq!(plan.tier(), TierIndex::SMALLEST);
    let small = plan_message(&capacity, TierIndex::SMALLEST, 100, Promotion::Allowed)?;
    assert!(small.segments().is_none());
    let plan = plan_message(&capacity, TierIndex::SMALLEST, 100_000, Promotion::Allowed)?;
    assert_eq!(plan.segments().map(|s| s.count()), Some(13));
    Ok(())
}

/// The example of `policy::plan_io_vector_lens` on an oversized element and on none.
#[test]
fn plan_io_vector_lens_edges_example() -> Result<(), Box<dyn std::error::Error>> {
    use crate::TierIndex;
    use crate::ladder::TierLadder;
    use crate::policy::{FrameCapacity, IoVecPlan, MessagePlan, Promotion, plan_io_vector_lens};
    use std::sync::Arc;
    // Thresholds 480 and 8192.
    let capacity = FrameCapacity::new(Arc::new(TierLadder::preset("two-tier")?), 0)?;
    let small = TierIndex::SMALLEST;
    assert_eq!(
        plan_io_vector_lens(&capacity, small, &[0, 2000, 10], Promotion::Allowed)?,
        IoVecPlan::Oversized {
            element: 1,
            plan: MessagePlan::Promote {
                to: TierIndex::new(1)
            }
        },
    );
    assert_eq!(
        plan_io_vector_lens(&capacity, small, &[], Promotion::Allowed)?,
        IoVecPlan::SendPrefix {
            tier: small,
            elements: 0,
            bytes: 0
        },
    );
    Ok(())
}
