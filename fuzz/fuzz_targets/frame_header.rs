//! Fuzz target `frame_header`: see `tierbuf_fuzz::frame_header` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tierbuf_fuzz::frame_header::run(data));
