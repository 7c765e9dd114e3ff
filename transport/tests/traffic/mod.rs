//! Message contents and sizes shared by the connection tests: deterministic, so that a
//! receiver can check what it got and a failure repeats.

/// `len` bytes of a pseudo-random stream chosen by `seed` (xorshift): neighbouring
/// messages and neighbouring bytes differ.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// `count` sizes from empty to four times `top_slot`, biased to small ones like real
/// traffic (six in ten below 240 bytes, three below 4 KiB), from a fixed seed.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub(crate) fn sizes(count: usize, top_slot: usize) -> Vec<usize> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            match state % 10 {
                0 => (state >> 8) as usize % (4 * top_slot),
                1..=3 => (state >> 8) as usize % 4096,
                _ => (state >> 8) as usize % 240,
            }
        })
        .collect()
}
