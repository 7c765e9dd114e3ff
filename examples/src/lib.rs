//! Services built on tierbuf, each a library here and a runnable example under
//! `examples/`: [`kv`], a key-value store served over tierbuf connections
//! (`cargo run --release -p tierbuf-examples --example kv`, `docs/services.md`).

#![warn(missing_docs)]

pub mod kv;
