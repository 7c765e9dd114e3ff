//! Models of the `pool` crate: the slot pool's take/give-back protocol and the budget's
//! admission. The planted-bug variants of these models are in `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::pool_models::{budget_admission, slots_hand_over};

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
