//! Models of the `transport` crate's connections. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::connection_models::returned_slots_across_threads;

#[test]
fn connection_returned_slots_across_threads() {
    tierbuf_loom_tests::harness::connection_builder().check(returned_slots_across_threads);
}

#[test]
fn a_sender_queues_a_filled_slot_across_a_tier_swap() {
    loom::model(
        tierbuf_loom_tests::connection_models::a_sender_queues_a_filled_slot_across_a_tier_swap,
    );
}

#[test]
fn a_flush_takes_every_message_queued_before_it() {
    loom::model(
        tierbuf_loom_tests::connection_models::a_flush_takes_every_message_queued_before_it,
    );
}
