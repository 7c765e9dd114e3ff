//! The messages of the demo's traffic: the size of every request ([`MessageSizes`]), the
//! size classes of the latency report, and the bytes every request and reply carries, so
//! that each side can check what arrived ([`fill`], [`check`]).

use tierbuf_tiers::ladder::TierLadder;

use super::DemoError;

/// Size classes of the latency report, by the tier a message fits whole.
pub(super) const CLASSES: usize = 3;

/// The request sizes: small (tier 0), large (up to the top tier), huge (past it).
pub(super) struct MessageSizes {
    small_max: usize,
    top: usize,
    large_every: usize,
    seed: u64,
}

impl MessageSizes {
    pub(super) fn new(ladder: &TierLadder, large_every: usize, seed: u64) -> MessageSizes {
        let thresholds: Vec<usize> = ladder
            .tiers()
            .iter()
            .map(|t| t.promote_threshold())
            .collect();
        MessageSizes {
            small_max: thresholds[0] / 2,
            top: *thresholds.last().unwrap_or(&thresholds[0]),
            large_every,
            seed,
        }
    }

    /// The size of request `sequence` of connection `connection`.
    pub(super) fn size(&self, connection: usize, sequence: usize) -> usize {
        let draw = mix(self.seed ^ ((connection as u64) << 32) ^ sequence as u64);
        let pick = draw as usize;
        if !pick.is_multiple_of(self.large_every) {
            1 + (pick >> 8) % self.small_max
        } else if (pick >> 4).is_multiple_of(10) {
            self.top + 1 + (pick >> 8) % (2 * self.top)
        } else {
            self.small_max + 1 + (pick >> 8) % (self.top - self.small_max)
        }
    }

    /// The latency class of a size: 0 small, 1 large, 2 segmented.
    pub(super) fn class(&self, len: usize) -> usize {
        match len {
            len if len <= self.small_max => 0,
            len if len <= self.top => 1,
            _ => 2,
        }
    }
}

/// One step of SplitMix64: `x` scrambled into a well-spread 64-bit value.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The bytes of message `sequence` of connection `connection`, `len` long; a reply uses
/// `reply = true`.
pub(super) fn fill(
    buffer: &mut Vec<u8>,
    connection: usize,
    sequence: usize,
    reply: bool,
    len: usize,
) {
    let seed = mix((connection as u64) << 20 ^ (sequence as u64) << 1 ^ u64::from(reply));
    buffer.clear();
    buffer.extend((0..len).map(|i| (seed as usize).wrapping_add(i * 131) as u8));
}

/// Fails unless `message` holds the bytes [`fill`] gives it; `scratch` is room for them.
pub(super) fn check(
    message: &[u8],
    connection: usize,
    sequence: usize,
    reply: bool,
    scratch: &mut Vec<u8>,
) -> Result<(), DemoError> {
    fill(scratch, connection, sequence, reply, message.len());
    if message != &scratch[..] {
        return Err(format!(
            "connection {connection}: {} {sequence} arrived with wrong bytes",
            if reply { "reply" } else { "request" }
        )
        .into());
    }
    Ok(())
}
