//! Connections over a provider endpoint: the frame header, credits and reassembly that
//! `docs/connection.md` describes.

pub mod credits;
pub mod header;
pub mod reassembly;
