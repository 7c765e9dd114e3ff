//! Fuzz target `control_codec`: see `tierbuf_fuzz::control_codec` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tierbuf_fuzz::control_codec::run(data));
