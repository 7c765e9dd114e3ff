//! Every model with its planted bug: each test passes only when loom reports the failure
//! the bug causes. A separate test binary (so a separate process) from the clean models,
//! because a planted bug is a process-wide switch.
#![cfg(loom)]

use tierbuf_loom_tests::connection_models::returned_slots_across_threads;
use tierbuf_loom_tests::harness::{connection_builder, expect_caught, expect_caught_with};
use tierbuf_loom_tests::pool_models::{budget_admission, budget_peak, slots_hand_over};
use tierbuf_loom_tests::tiers_models::{demotion_against_in_flight_slot, promotion_race};
use tierbuf_loom_tests::transport_models::{exposure, post_is_never_stranded, shm};
use tierbuf_pool::sync::planted::Bug;

#[test]
fn slot_release_relaxed_is_caught() {
    let message = expect_caught(Bug::SlotReleaseRelaxed, || slots_hand_over(1));
    assert!(message.contains("Causality violation"), "{message}");
}

#[test]
fn slot_take_check_then_set_is_caught() {
    // Loom reaches the double take either as a second owner or as the two owners' writes
    // without happens-before, whichever interleaving it explores first.
    let message = expect_caught(Bug::SlotTakeCheckThenSet, || slots_hand_over(2));
    assert!(
        message.contains("second owner") || message.contains("Causality violation"),
        "{message}"
    );
}

#[test]
fn budget_check_then_add_is_caught() {
    let message = expect_caught(Bug::BudgetCheckThenAdd, budget_admission);
    assert!(
        message.contains("passed its cap") || message.contains("exactly one"),
        "{message}"
    );
}

#[test]
fn budget_peak_load_then_store_is_caught() {
    let message = expect_caught(Bug::BudgetPeakLoadThenStore, budget_peak);
    assert!(message.contains("lost the larger total"), "{message}");
}

#[test]
fn change_claim_check_then_set_is_caught() {
    let message = expect_caught(Bug::ChangeClaimCheckThenSet, promotion_race);
    assert!(message.contains("exactly one promotion"), "{message}");
}

#[test]
fn reclaim_without_retire_is_caught() {
    let message = expect_caught(Bug::ReclaimWithoutRetire, demotion_against_in_flight_slot);
    assert!(
        message.contains("while one of its slots is held"),
        "{message}"
    );
}

#[test]
fn loopback_no_recheck_after_release_is_caught() {
    let message = expect_caught(Bug::LoopbackNoRecheckAfterRelease, post_is_never_stranded);
    assert!(message.contains("stranded"), "{message}");
}

#[test]
fn lent_count_load_then_store_is_caught() {
    let message = expect_caught_with(
        Bug::LentCountLoadThenStore,
        connection_builder(),
        returned_slots_across_threads,
    );
    assert!(message.contains("lost an update"), "{message}");
}

#[test]
fn returned_push_relaxed_is_caught() {
    let message = expect_caught_with(
        Bug::ReturnedPushRelaxed,
        connection_builder(),
        returned_slots_across_threads,
    );
    assert!(message.contains("Causality violation"), "{message}");
}

#[test]
fn shm_publish_relaxed_is_caught() {
    let message = expect_caught(
        Bug::ShmPublishRelaxed,
        shm::delivery_publishes_the_whole_message,
    );
    assert!(
        message.contains("Causality violation") || message.contains("before it was written"),
        "{message}"
    );
}

#[test]
fn shm_clear_result_after_post_is_caught() {
    let message = expect_caught(
        Bug::ShmClearResultAfterPost,
        shm::delivery_publishes_the_whole_message,
    );
    assert!(
        message.contains("earlier lap") || message.contains("branches"),
        "{message}"
    );
}

#[test]
fn shm_short_marked_after_post_is_caught() {
    let message = expect_caught(
        Bug::ShmShortMarkedAfterPost,
        shm::a_short_receive_is_never_shown_to_hold_an_inline_message,
    );
    assert!(message.contains("too short for"), "{message}");
}

#[test]
fn shm_copy_gate_check_then_set_is_caught() {
    let message = expect_caught(
        Bug::ShmCopyGateCheckThenSet,
        shm::close_waits_for_a_copy_in_progress,
    );
    assert!(message.contains("Causality violation"), "{message}");
}

#[test]
fn shm_wake_looked_at_before_publish_is_caught() {
    let message = expect_caught(
        Bug::ShmWakeLookedAtBeforePublish,
        shm::a_parked_receiver_is_woken_by_the_delivery_it_missed,
    );
    assert!(message.contains("did not wake it"), "{message}");
}

#[test]
fn spin_claim_check_then_set_is_caught() {
    let message = expect_caught(
        Bug::SpinClaimCheckThenSet,
        tierbuf_loom_tests::readiness_models::one_spin_at_a_time,
    );
    assert!(message.contains("two tasks spin at once"), "{message}");
}

#[test]
fn spin_give_up_unconditional_is_caught() {
    let message = expect_caught(
        Bug::SpinGiveUpUnconditional,
        tierbuf_loom_tests::readiness_models::giving_up_a_lapsed_claim_keeps_the_next,
    );
    assert!(message.contains("cleared the claim in force"), "{message}");
}

#[test]
fn send_queue_wake_before_push_is_caught() {
    let message = expect_caught(
        Bug::SendQueueWakeBeforePush,
        tierbuf_loom_tests::connection_models::a_sender_queues_a_filled_slot_across_a_tier_swap,
    );
    assert!(message.contains("did not wake it"), "{message}");
}

#[test]
fn ready_queue_look_before_push_is_caught() {
    let message = expect_caught(
        Bug::ReadyQueueLookBeforePush,
        tierbuf_loom_tests::readiness_models::a_queued_connection_is_never_slept_through,
    );
    assert!(
        message.contains("slept with a connection queued"),
        "{message}"
    );
}

#[test]
fn send_queue_count_after_push_is_caught() {
    let message = expect_caught(
        Bug::SendQueueCountAfterPush,
        tierbuf_loom_tests::connection_models::a_flush_takes_every_message_queued_before_it,
    );
    assert!(message.contains("stopped short"), "{message}");
}

#[test]
fn exposure_revoke_without_wait_is_caught() {
    let message = expect_caught(
        Bug::ExposureRevokeWithoutWait,
        exposure::revocation_waits_out_an_access,
    );
    assert!(message.contains("Causality violation"), "{message}");
}
