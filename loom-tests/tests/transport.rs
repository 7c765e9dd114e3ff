//! Models of the `transport` crate's loopback provider and shared-memory queues. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::transport_models::{exposure, post_is_never_stranded, shm};

#[test]
fn loopback_post_is_never_stranded() {
    loom::model(post_is_never_stranded);
}

#[test]
fn shm_delivery_publishes_the_whole_message() {
    loom::model(shm::delivery_publishes_the_whole_message);
}

#[test]
fn shm_a_short_receive_is_never_shown_to_hold_an_inline_message() {
    loom::model(shm::a_short_receive_is_never_shown_to_hold_an_inline_message);
}

#[test]
fn shm_close_waits_for_a_copy_in_progress() {
    loom::model(shm::close_waits_for_a_copy_in_progress);
}

#[test]
fn shm_a_parked_receiver_is_woken_by_the_delivery_it_missed() {
    loom::model(shm::a_parked_receiver_is_woken_by_the_delivery_it_missed);
}

#[test]
fn exposure_revocation_waits_out_an_access() {
    loom::model(exposure::revocation_waits_out_an_access);
}
