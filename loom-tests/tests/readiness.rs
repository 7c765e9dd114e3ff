//! Models of the `transport` crate's readiness layer. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::readiness_models;

#[test]
fn one_spin_at_a_time() {
    loom::model(readiness_models::one_spin_at_a_time);
}

#[test]
fn giving_up_a_lapsed_claim_keeps_the_next() {
    loom::model(readiness_models::giving_up_a_lapsed_claim_keeps_the_next);
}

#[test]
fn a_queued_connection_is_never_slept_through() {
    loom::model(readiness_models::a_queued_connection_is_never_slept_through);
}
