//! Models of the `pool` crate: the slot pool's take/give-back protocol and the budget's
//! admission and peak. The planted-bug variants of these models are in `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::pool_models::{budget_admission, budget_peak, slots_hand_over};

#[test]
fn slot_pool_one_slot_hand_over() {
    loom::model(|| slots_hand_over(1));
}

#[test]
fn slot_pool_two_slots_race() {
    loom::model(|| slots_hand_over(2));
}

#[test]
fn budget_admits_within_cap() {
    loom::model(budget_admission);
}

#[test]
fn budget_peak_keeps_the_largest_total() {
    loom::model(budget_peak);
}
