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

/// An error said with what was being done when it came: the error itself stays its
/// [`source`](std::error::Error::source), so [`with_causes`] still reaches every cause
/// under it (formatting it into a string of its own would drop them).
///
/// ```
/// use tierbuf_examples::{Doing, with_causes};
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let error = Doing::new("connection 0 to the peer process", refused);
/// assert_eq!(with_causes(&error), "connection 0 to the peer process: connection refused");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct Doing {
    what: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl Doing {
    /// `source`, which came while doing `what`.
    pub fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Doing {
        Doing {
            what: what.into(),
            source: source.into(),
        }
    }
}
