//! Error text shared by the tests that check what a failure says.

/// An error with every source under it, joined by colons: what failed, then why.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}
