//! The harnesses of tierbuf's fuzz targets (`docs/transport.md`, "Fuzzing").
//!
//! Each module is one target: its `run` takes one fuzz input and asserts the properties
//! its documentation names (a failed assertion or a panic of the library is a crash), and
//! its `seeds` are the committed seed corpus, made by the real encoders. The binaries in
//! `fuzz_targets/` hand libFuzzer's inputs to `run`; `tests/corpus.rs` runs every
//! committed input through `run` as a plain test, and checks that the committed seeds are
//! what `seeds` makes.

pub mod control_codec;
pub mod core_frames;
pub mod frame_header;
mod reader;
pub mod shm_records;

/// One fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Its name: the binary in `fuzz_targets/` and the folder of `corpus/`.
    pub name: &'static str,
    /// Runs one input, panicking on a broken property.
    pub run: fn(&[u8]),
    /// The seed corpus: a name for each input, and its bytes.
    pub seeds: fn() -> Vec<(&'static str, Vec<u8>)>,
}

/// Every target.
pub const TARGETS: [Target; 4] = [
    Target {
        name: "control_codec",
        run: control_codec::run,
        seeds: control_codec::seeds,
    },
    Target {
        name: "frame_header",
        run: frame_header::run,
        seeds: frame_header::seeds,
    },
    Target {
        name: "core_frames",
        run: core_frames::run,
        seeds: core_frames::seeds,
    },
    Target {
        name: "shm_records",
        run: shm_records::run,
        seeds: shm_records::seeds,
    },
];
