//! Models of the `tiers` crate's `TieredRegion`. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::tiers_models::{
    demotion_against_in_flight_slot, promotion_race,
    release_while_a_demotion_gives_back_a_retained_tier, swap_during_read,
};

#[test]
fn tier_swap_during_read() {
    loom::model(swap_during_read);
}

#[test]
fn tier_promotion_race() {
    loom::model(promotion_race);
}

#[test]
fn tier_demotion_against_in_flight_slot() {
    loom::model(demotion_against_in_flight_slot);
}

#[test]
fn tier_release_while_a_demotion_gives_back_a_retained_tier() {
    loom::model(release_while_a_demotion_gives_back_a_retained_tier);
}
