//! Fuzz target `core_frames`: see `tierbuf_fuzz::core_frames` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tierbuf_fuzz::core_frames::run(data));
