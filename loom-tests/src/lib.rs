//! Placeholder: this crate is filled by a later change.
