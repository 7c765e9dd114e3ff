//! Fuzz target `shm_records`: see `tierbuf_fuzz::shm_records` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tierbuf_fuzz::shm_records::run(data));
