//! Loom models of tierbuf's lock-free protocols.
//!
//! The models build the shipped `pool` (and later `tiers`, `transport`) code with loom's
//! atomics, `Arc`, cells and threads behind each crate's `sync` facade. Every model runs
//! twice: clean, where loom must find no failure, and with one known bug planted through
//! `tierbuf_pool::sync::planted`, where loom must find it. A model that cannot fail would
//! prove nothing.
//!
//! Run (the README's loom command):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test -p tierbuf-loom-tests --release --target-dir target/loom
//! ```
//!
//! Without `--cfg loom` this crate is empty and its tests compile to nothing.

#![warn(missing_docs)]

#[cfg(loom)]
pub mod connection_models;
#[cfg(loom)]
pub mod harness;
#[cfg(loom)]
pub mod pool_models;
#[cfg(loom)]
pub mod readiness_models;
#[cfg(loom)]
pub mod tiers_models;
#[cfg(loom)]
pub mod transport_models;
