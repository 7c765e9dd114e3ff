//! What one process measures of the connection sides it ran ([`Figures`]), and the text
//! form in which the process that ran the servers hands its figures to the one that
//! prints the report ([`encode`], [`decode`]).

use std::collections::HashMap;
use std::ops::Add;

use tierbuf_pool::MemoryBudget;

use super::DemoError;

/// Counters summed over connections.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Totals {
    pub(super) promotions: u64,
    pub(super) demotions: u64,
    pub(super) nacks: u64,
    pub(super) messages: u64,
    pub(super) bytes: u64,
    /// The send tiers of every connection added up: 0 when all send on tier 0.
    pub(super) send_tier_sum: u64,
}

impl Add for Totals {
    type Output = Totals;

    fn add(self, other: Totals) -> Totals {
        Totals {
            promotions: self.promotions + other.promotions,
            demotions: self.demotions + other.demotions,
            nacks: self.nacks + other.nacks,
            messages: self.messages + other.messages,
            bytes: self.bytes + other.bytes,
            send_tier_sum: self.send_tier_sum + other.send_tier_sum,
        }
    }
}

/// One process's registered bytes, measured on its budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Registered {
    /// Once every connection was set up.
    pub(super) at_start: u64,
    /// The most seen during traffic.
    pub(super) peak: u64,
    /// After the quiet phase.
    pub(super) quiet: u64,
    /// The reservoirs' spare regions, after the quiet phase.
    pub(super) reservoir: u64,
}

/// What one process measured of the connection sides it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Figures {
    pub(super) registered: Registered,
    /// `Totals::send_tier_sum` at the end of traffic.
    pub(super) busy_tier_steps: u64,
    /// The counters after the quiet phase.
    pub(super) quiet: Totals,
}

impl Figures {
    /// The figures at the end of the quiet phase: registered memory now against
    /// `at_start` and the traffic's `peak`, the reservoirs' `spare` bytes, and the tier
    /// counters.
    pub(super) fn after_quiet(
        at_start: u64,
        peak: u64,
        budget: &MemoryBudget,
        spare: u64,
        busy_tier_steps: u64,
        quiet: Totals,
    ) -> Figures {
        Figures {
            registered: Registered {
                at_start,
                peak,
                quiet: budget.in_use(),
                reservoir: spare,
            },
            busy_tier_steps,
            quiet,
        }
    }
}

/// The fields of the peer's report.
fn fields(figures: &Figures) -> [(&'static str, u64); 11] {
    let Figures {
        registered,
        busy_tier_steps,
        quiet,
    } = *figures;
    [
        ("registered_at_start", registered.at_start),
        ("registered_peak", registered.peak),
        ("registered_quiet", registered.quiet),
        ("reservoir", registered.reservoir),
        ("busy_tier_steps", busy_tier_steps),
        ("promotions", quiet.promotions),
        ("demotions", quiet.demotions),
        ("nacks", quiet.nacks),
        ("messages", quiet.messages),
        ("bytes", quiet.bytes),
        ("tier_steps", quiet.send_tier_sum),
    ]
}

/// `figures` as `name=value` fields separated by spaces.
pub(super) fn encode(figures: &Figures) -> String {
    fields(figures)
        .map(|(name, value)| format!("{name}={value}"))
        .join(" ")
}

/// The figures that [`encode`] wrote as `text`.
pub(super) fn decode(text: &str) -> Result<Figures, DemoError> {
    let values: HashMap<&str, u64> = text
        .split_whitespace()
        .map(|field| {
            let (name, value) = field.split_once('=')?;
            Some((name, value.parse().ok()?))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| format!("the peer's report is malformed: {text:?}"))?;
    let value = |name: &str| {
        values
            .get(name)
            .copied()
            .ok_or_else(|| format!("the peer's report lacks {name}: {text:?}"))
    };
    Ok(Figures {
        registered: Registered {
            at_start: value("registered_at_start")?,
            peak: value("registered_peak")?,
            quiet: value("registered_quiet")?,
            reservoir: value("reservoir")?,
        },
        busy_tier_steps: value("busy_tier_steps")?,
        quiet: Totals {
            promotions: value("promotions")?,
            demotions: value("demotions")?,
            nacks: value("nacks")?,
            messages: value("messages")?,
            bytes: value("bytes")?,
            send_tier_sum: value("tier_steps")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written() {
        let figures = Figures {
            registered: Registered {
                at_start: 1,
                peak: 2,
                quiet: 3,
                reservoir: 4,
            },
            busy_tier_steps: 5,
            quiet: Totals {
                promotions: 6,
                demotions: 7,
                nacks: 8,
                messages: 9,
                bytes: 10,
                send_tier_sum: 11,
            },
        };
        assert_eq!(decode(&encode(&figures)).unwrap(), figures);
    }

    #[test]
    fn a_malformed_report_is_refused() {
        assert!(decode("promotions=1 demotions").is_err());
        let error = decode("promotions=1").unwrap_err().to_string();
        assert!(error.contains("lacks registered_at_start"), "{error}");
    }
}
