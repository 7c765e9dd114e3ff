//! Verbs-shaped providers and connections that apply tiers to two-sided send/receive.

#![warn(missing_docs)]

pub mod connection;
