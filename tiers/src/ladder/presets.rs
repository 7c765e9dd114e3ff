//! Ready-made ladders, each shaped for one kind of traffic (the reasoning is also in
//! `docs/ladders.md`).
//!
//! - `two-tier`: the two phases of WO 2007/139426. 16 slots of 512 B (threshold 480 B, inside
//!   the patent's 80–99 % tolerance band: a connection promotes a little early) then 16 slots
//!   of 8 KiB. A connection starts with 18 KiB registered (9 KiB send + 9 KiB receive, each
//!   slot with its 64 B of headroom for the frame header) instead of the 258 KiB a static
//!   8 KiB configuration registers: the patent's "about 256 KB to about 16 KB". Replaced
//!   tiers are freed and nothing is held in reserve, as in the patent.
//! - `rpc`: many small control messages with occasional large replies. 32 slots of 512 B give
//!   enough receive credits for pipelined requests, 8 KiB covers most replies, 64 KiB the rare
//!   bulk reply. Large replies come and go, so connections demote soon (10 s idle, 2 s
//!   hysteresis) and keep the small tiers (`retain_replaced`), which cost little next to the top
//!   tier and make demotion free; 4 regions per tier in reserve take registration off the path
//!   of a promotion.
//! - `storage`: block I/O up to 1 MiB. 4 KiB slots for metadata and small I/O, 64 KiB for
//!   medium I/O, and 1 MiB slots so a whole block never needs segmenting. Streams last, so
//!   connections stay promoted longer (60 s idle, 10 s hysteresis); the 1 MiB tier is large, so
//!   replaced tiers are freed; a promotion that registers and pins its region is slow next
//!   to one that takes a spare (`benches/benches/tiers.rs`, `tiers/promote`:
//!   `register_and_pin` against `from_reservoir`), the more so for a 4 MiB region, so 2
//!   regions per tier are kept in reserve.

use std::time::Duration;

use super::{LoadError, TierLadder};

/// The names [`TierLadder::preset`] accepts.
///
/// ```
/// use tierbuf_tiers::ladder::{PRESET_NAMES, TierLadder};
/// for name in PRESET_NAMES {
///     assert!(TierLadder::preset(name).is_ok());
/// }
/// ```
pub const PRESET_NAMES: &[&str] = &["two-tier", "rpc", "storage"];

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

impl TierLadder {
    /// The ready-made ladder called `name` (one of [`PRESET_NAMES`]).
    ///
    /// ```
    /// use tierbuf_tiers::ladder::{LoadError, TierLadder};
    /// let storage = TierLadder::preset("storage")?;
    /// assert_eq!(storage.tiers().last().unwrap().slot_size(), 1 << 20);
    /// assert!(matches!(TierLadder::preset("tiny"), Err(LoadError::UnknownPreset { .. })));
    /// # Ok::<(), LoadError>(())
    /// ```
    pub fn preset(name: &str) -> Result<TierLadder, LoadError> {
        let builder = match name {
            "two-tier" => TierLadder::builder()
                .tier(512, 16, 480)
                .tier(8 * KIB, 16, 8 * KIB)
                .demote_after(Duration::from_secs(60))
                .hysteresis(Duration::from_secs(5))
                .retain_replaced(false)
                .reservoir_regions(0),
            "rpc" => TierLadder::builder()
                .tier(512, 32, 512)
                .tier(8 * KIB, 16, 8 * KIB)
                .tier(64 * KIB, 8, 64 * KIB)
                .demote_after(Duration::from_secs(10))
                .hysteresis(Duration::from_secs(2))
                .retain_replaced(true)
                .reservoir_regions(4),
            "storage" => TierLadder::builder()
                .tier(4 * KIB, 32, 4 * KIB)
                .tier(64 * KIB, 16, 64 * KIB)
                .tier(MIB, 4, MIB)
                .demote_after(Duration::from_secs(60))
                .hysteresis(Duration::from_secs(10))
                .retain_replaced(false)
                .reservoir_regions(2),
            _ => {
                return Err(LoadError::UnknownPreset {
                    name: name.to_owned(),
                });
            }
        };
        Ok(builder
            .build()
            .expect("every preset is a valid ladder (checked by the preset tests)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_preset_builds_and_no_other_name_does() {
        for name in PRESET_NAMES {
            let ladder = TierLadder::preset(name).unwrap();
            assert_eq!(
                TierLadder::from_toml_str(&ladder.to_toml_string(), name).unwrap(),
                ladder
            );
        }
        let err = TierLadder::preset("Patent").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown ladder preset \"Patent\"; the presets are two-tier, rpc, storage"
        );
    }

    #[test]
    fn the_two_tier_preset_goes_from_18_kib_to_258_kib_per_connection() {
        // 16 slots each way of 512 B, then of 8 KiB, each slot with 64 B of headroom.
        let table = TierLadder::preset("two-tier").unwrap().memory_table(1);
        assert_eq!(table.rows()[0].per_connection(), 18 * 1024);
        assert_eq!(table.rows()[1].per_connection(), 258 * 1024);
        assert_eq!(table.static_per_connection(), 258 * 1024);
    }

    #[test]
    fn the_storage_preset_carries_a_whole_megabyte_block_unsegmented() {
        let ladder = TierLadder::preset("storage").unwrap();
        assert_eq!(ladder.tier_for_len(MIB), Some(ladder.top()));
        assert_eq!(ladder.tier_for_len(MIB + 1), None);
    }
}
