//! Services built on tierbuf, each a library here and a runnable example under
//! `examples/`: [`kv`], a key-value store served over tierbuf connections
//! (`cargo run --release -p tierbuf-examples --example kv`, `docs/services.md`); and
//! [`process`], the second process of the examples' and the demo's two-process runs.

#![warn(missing_docs)]

pub mod kv;
pub mod process;

/// `error` and every `source()` under it, joined by colons: what failed, then why (a
/// connection that failed because its peer died says so).
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
