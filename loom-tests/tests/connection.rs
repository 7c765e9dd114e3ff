//! Models of the `transport` crate's connections. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::connection_models::returned_slots_across_threads;

#[test]
fn connection_returned_slots_across_threads() {
    loom::model(returned_slots_across_threads);
}
