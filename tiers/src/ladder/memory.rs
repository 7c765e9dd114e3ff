//! What a ladder costs in registered memory, per connection and for many connections.
//!
//! A connection *at tier k* registers one send and one receive region of tier k, each of
//! `slot_count` slots of the tier's size and [`SLOT_HEADROOM`](super::SLOT_HEADROOM) bytes
//! for the frame header ([`TierSpec::region_len`]). With
//! [`LadderPolicy::retain_replaced`](super::LadderPolicy::retain_replaced) it also still
//! holds the send and receive regions of every tier below k; without it (the default)
//! those were freed on promotion. The comparison is a static configuration that registers the
//! top tier's send and receive regions up front for every connection. Reserve regions
//! ([`LadderPolicy::reservoir_regions`](super::LadderPolicy::reservoir_regions) of each tier)
//! are registered once per process, whatever the number of connections.
//!
//! Ladder validation guarantees that per-connection figures fit in a `u64`; totals for many
//! connections are `u128`, which a `u64` times a `usize` cannot overflow.

use std::fmt;

use super::size::format_size_readable;
use super::{SLOT_HEADROOM, TierLadder, TierSpec};
use crate::TierIndex;

/// One tier's line of a [`MemoryTable`].
///
/// ```
/// use tierbuf_tiers::{TierIndex, ladder::TierLadder};
/// let table = TierLadder::preset("two-tier")?.memory_table(10_000);
/// let top = &table.rows()[1];
/// assert_eq!(top.tier(), TierIndex::new(1));
/// assert_eq!(top.spec().region_len(), 16 * (8192 + 64)); // 129 KiB
/// assert_eq!(top.per_connection(), 2 * 16 * (8192 + 64)); // 258 KiB
/// assert_eq!(top.all_connections(), 10_000 * 2 * 16 * (8192 + 64));
/// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRow {
    tier: TierIndex,
    spec: TierSpec,
    per_connection: u64,
    all_connections: u128,
}

impl MemoryRow {
    /// The tier this line is about.
    pub fn tier(&self) -> TierIndex {
        self.tier
    }

    /// The tier's shape: size, slot count, threshold and region length.
    pub fn spec(&self) -> &TierSpec {
        &self.spec
    }

    /// Bytes one connection at this tier registers (see the module documentation).
    pub fn per_connection(&self) -> u64 {
        self.per_connection
    }

    /// Bytes the table's connections register when all are at this tier.
    pub fn all_connections(&self) -> u128 {
        self.all_connections
    }
}

/// Registered bytes per tier and per connection, against registering the top tier up front.
/// Its `Display` is an aligned text table.
///
/// ```
/// use tierbuf_tiers::ladder::TierLadder;
/// let table = TierLadder::preset("two-tier")?.memory_table(10_000);
/// assert_eq!(table.static_total(), 10_000 * 2 * 16 * (8192 + 64));
/// let text = table.to_string();
/// assert!(text.contains("175.8 MiB"), "{text}"); // 10,000 connections at 18 KiB (tier 0)
/// assert!(text.contains("2.5 GiB"), "{text}");   // 10,000 connections at 258 KiB
/// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTable {
    connections: usize,
    retain_replaced: bool,
    rows: Vec<MemoryRow>,
    static_per_connection: u64,
    reservoir_regions: usize,
    reservoir_bytes: u128,
}

impl MemoryTable {
    pub(super) fn new(ladder: &TierLadder, connections: usize) -> MemoryTable {
        let retain_replaced = ladder.policy().retain_replaced();
        let send_and_receive = |region_len: usize| 2 * region_len as u64;
        let mut retained_below = 0;
        let rows: Vec<MemoryRow> = ladder
            .iter()
            .map(|(tier, spec)| {
                let own = send_and_receive(spec.region_len());
                let per_connection = if retain_replaced {
                    retained_below + own
                } else {
                    own
                };
                retained_below += own;
                MemoryRow {
                    tier,
                    spec: *spec,
                    per_connection,
                    all_connections: u128::from(per_connection) * connections as u128,
                }
            })
            .collect();
        let top_region_len = rows.last().map_or(0, |top| top.spec.region_len());
        let reservoir_regions = ladder.policy().reservoir_regions();
        let all_tiers_once: u128 = rows.iter().map(|row| row.spec.region_len() as u128).sum();
        MemoryTable {
            connections,
            retain_replaced,
            static_per_connection: send_and_receive(top_region_len),
            rows,
            reservoir_regions,
            reservoir_bytes: all_tiers_once * reservoir_regions as u128,
        }
    }

    /// The number of connections the totals are for.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// assert_eq!(TierLadder::preset("rpc")?.memory_table(7).connections(), 7);
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// One line per tier, smallest first.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// // rpc retains replaced tiers: at tier 1 a connection holds tiers 0 and 1.
    /// let table = TierLadder::preset("rpc")?.memory_table(1);
    /// assert_eq!(table.rows()[1].per_connection(), 2 * (32 * (512 + 64) + 16 * (8192 + 64)));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn rows(&self) -> &[MemoryRow] {
        &self.rows
    }

    /// Bytes one connection registers when the top tier is registered up front, statically.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let table = TierLadder::preset("storage")?.memory_table(1);
    /// assert_eq!(table.static_per_connection(), 2 * 4 * (1024 * 1024 + 64));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn static_per_connection(&self) -> u64 {
        self.static_per_connection
    }

    /// Bytes the table's connections register with the static configuration.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// let table = TierLadder::preset("storage")?.memory_table(3);
    /// assert_eq!(table.static_total(), 3 * 2 * 4 * (1024 * 1024 + 64));
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn static_total(&self) -> u128 {
        u128::from(self.static_per_connection) * self.connections as u128
    }

    /// Bytes the process keeps registered in reserve, independent of the connections.
    ///
    /// ```
    /// # use tierbuf_tiers::ladder::TierLadder;
    /// // storage: 2 regions each of 32 x 4 KiB, 16 x 64 KiB and 4 x 1 MiB slots, each
    /// // slot with its 64 bytes of headroom.
    /// let table = TierLadder::preset("storage")?.memory_table(1);
    /// assert_eq!(
    ///     table.reservoir_bytes(),
    ///     2 * (32 * (4096 + 64) + 16 * (65_536 + 64) + 4 * (1024 * 1024 + 64))
    /// );
    /// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
    /// ```
    pub fn reservoir_bytes(&self) -> u128 {
        self.reservoir_bytes
    }
}

/// Right-aligns every column but the first, which is left-aligned.
fn write_aligned(f: &mut fmt::Formatter<'_>, lines: &[[String; 7]]) -> fmt::Result {
    let mut widths = [0; 7];
    for line in lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for line in lines {
        let mut text = format!("{:<width$}", line[0], width = widths[0]);
        for (cell, width) in line.iter().zip(widths).skip(1) {
            text.push_str(&format!("  {cell:>width$}"));
        }
        writeln!(f, "{}", text.trim_end())?;
    }
    Ok(())
}

impl fmt::Display for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = if self.retain_replaced {
            "and of every tier below (retain_replaced)"
        } else {
            "only (tiers below are freed on promotion)"
        };
        writeln!(
            f,
            "A connection at tier k registers one send and one receive region of tier k {held}."
        )?;
        writeln!(
            f,
            "Every slot registers {} past its size, for the frame header.",
            format_size_readable(SLOT_HEADROOM as u128)
        )?;
        let size = |bytes: u128| format_size_readable(bytes);
        let mut lines = vec![[
            "tier".to_owned(),
            "slot size".to_owned(),
            "slots".to_owned(),
            "threshold".to_owned(),
            "region".to_owned(),
            "per connection".to_owned(),
            format!("{} connections", self.connections),
        ]];
        for row in &self.rows {
            lines.push([
                row.tier.get().to_string(),
                size(row.spec.slot_size() as u128),
                row.spec.slot_count().to_string(),
                size(row.spec.promote_threshold() as u128),
                size(row.spec.region_len() as u128),
                size(u128::from(row.per_connection)),
                size(row.all_connections),
            ]);
        }
        let top = self.rows.last().map_or(0, |row| row.tier.get());
        lines.push([
            format!("static (tier {top} up front)"),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            size(u128::from(self.static_per_connection)),
            size(self.static_total()),
        ]);
        write_aligned(f, &lines)?;
        writeln!(
            f,
            "Reserve, shared by the process: {} region(s) of every tier = {}.",
            self.reservoir_regions,
            size(self.reservoir_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeing_replaced_tiers_holds_one_tier_at_a_time() {
        // Regions, each slot with 64 B of headroom: (64 + 64) B x 4 = 512 B,
        // (1 KiB + 64) x 3 = 3264 B, (4 KiB + 64) x 3 = 12 480 B.
        let ladder = TierLadder::builder()
            .tier(64, 4, 64)
            .tier(1024, 3, 1024)
            .tier(4096, 3, 4096)
            .build()
            .unwrap();
        let table = ladder.memory_table(10);
        let per_connection: Vec<u64> = table.rows().iter().map(MemoryRow::per_connection).collect();
        assert_eq!(per_connection, [1024, 6528, 24_960]);
        let totals: Vec<u128> = table
            .rows()
            .iter()
            .map(MemoryRow::all_connections)
            .collect();
        assert_eq!(totals, [10_240, 65_280, 249_600]);
        assert_eq!(table.static_per_connection(), 24_960);
        assert_eq!(table.static_total(), 249_600);
        assert_eq!(table.reservoir_bytes(), 0);
    }

    #[test]
    fn retaining_replaced_tiers_holds_every_tier_below_too() {
        let ladder = TierLadder::builder()
            .tier(64, 4, 64)
            .tier(1024, 3, 1024)
            .tier(4096, 3, 4096)
            .retain_replaced(true)
            .reservoir_regions(2)
            .build()
            .unwrap();
        let table = ladder.memory_table(10);
        let per_connection: Vec<u64> = table.rows().iter().map(MemoryRow::per_connection).collect();
        assert_eq!(per_connection, [1024, 1024 + 6528, 1024 + 6528 + 24_960]);
        assert_eq!(table.static_per_connection(), 24_960);
        // Two regions (not pairs) of every tier: 2 x (512 + 3264 + 12480).
        assert_eq!(table.reservoir_bytes(), 32_512);
    }

    #[test]
    fn the_largest_possible_ladder_does_not_overflow_the_totals() {
        use crate::ladder::{MAX_RESERVOIR_REGIONS, MAX_SLOT_SIZE, MIN_SLOT_COUNT};
        let ladder = TierLadder::builder()
            .tier(MAX_SLOT_SIZE - 64, MIN_SLOT_COUNT, 64)
            .tier(MAX_SLOT_SIZE, MIN_SLOT_COUNT, 128)
            .reservoir_regions(MAX_RESERVOIR_REGIONS)
            .build()
            .unwrap();
        let table = ladder.memory_table(usize::MAX);
        assert!(table.static_total() > u128::from(u64::MAX));
        assert!(table.to_string().contains("TiB"));
    }

    #[test]
    fn the_display_is_an_aligned_table() {
        let text = TierLadder::preset("two-tier")
            .unwrap()
            .memory_table(10_000)
            .to_string();
        let expected = "\
A connection at tier k registers one send and one receive region of tier k only (tiers below are freed on promotion).
Every slot registers 64 B past its size, for the frame header.
tier                      slot size  slots  threshold   region  per connection  10000 connections
0                             512 B     16      480 B    9 KiB          18 KiB          175.8 MiB
1                             8 KiB     16      8 KiB  129 KiB         258 KiB            2.5 GiB
static (tier 1 up front)                                               258 KiB            2.5 GiB
Reserve, shared by the process: 0 region(s) of every tier = 0 B.
";
        assert_eq!(text, expected);
    }
}
