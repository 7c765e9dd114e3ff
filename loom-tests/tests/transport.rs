//! Models of the `transport` crate's loopback provider. The planted-bug variants are in
//! `planted.rs`.
#![cfg(loom)]

use tierbuf_loom_tests::transport_models::post_is_never_stranded;

#[test]
fn loopback_post_is_never_stranded() {
    loom::model(post_is_never_stranded);
}
