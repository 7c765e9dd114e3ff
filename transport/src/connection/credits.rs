//! Credits: the peer's posted receives as this side knows them, and the receives this side
//! posted but has not yet told the peer about (see `docs/connection.md`, rules 1–3).
//!
//! # Invariants
//!
//! - [`Credits`] lists the peer's posted receives in posting order, as runs of one tier;
//!   [`Credits::take`] consumes the oldest, which is the buffer the next frame lands in.
//! - [`Credits`] never holds more than its limit, the most receives the peer could have
//!   posted: a grant past it is refused whole ([`GrantPastLimit`]), so no sum overflows and
//!   the list of runs (at least one credit each) stays bounded whatever the peer sends.
//! - [`Credits::has_data_credit`] never offers the last credit: it is kept for frames that
//!   return credits or carry control messages ([`RESERVED_CREDITS`]).
//! - [`PendingGrants`] hands out runs in posting order, so grants reach the peer in the
//!   order the receives were posted.

use std::collections::VecDeque;

use super::header::Grant;

/// Credits data frames leave for credit and control frames.
pub(super) const RESERVED_CREDITS: u32 = 1;

/// Receives a side keeps posted however many messages its user holds, and so the fewest
/// slots a tier may have: one for the credit data frames leave ([`RESERVED_CREDITS`]),
/// one for data, and one more so that a credit frame sent to a peer left one credit
/// grants it at least two receives for the one it consumes. With two, two sides each
/// left one credit would either trade one-receive credit frames for ever or wait for
/// each other for ever.
pub(super) const MIN_POSTED: u32 = 3;

/// The peer's posted receives, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Credits {
    runs: VecDeque<(u8, u32)>,
    total: u32,
    /// The most credits the peer can have granted.
    limit: u32,
}

/// A grant that would take the credits past their limit; nothing of it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GrantPastLimit {
    /// The credits held before the grant.
    pub(super) held: u32,
    /// The limit.
    pub(super) limit: u32,
}

impl Credits {
    /// No credits yet, and never more than `limit` (the most receives the peer can have
    /// posted, [`ConnectionConfig::max_send_credits`](super::ConnectionConfig)).
    pub(super) fn new(limit: u32) -> Credits {
        Credits {
            runs: VecDeque::new(),
            total: 0,
            limit,
        }
    }

    /// The credits a connection starts with, `initial` (the peer's first receives, which
    /// both sides know without a grant), within `limit`.
    pub(super) fn starting_with(limit: u32, initial: Grant) -> Credits {
        let mut credits = Credits::new(limit);
        let count = u32::from(initial.count).min(limit);
        if count > 0 {
            credits.runs.push_back((initial.tier, count));
            credits.total = count;
        }
        credits
    }

    /// Adds `grant.count` receives of `grant.tier`, posted after every credit held now.
    ///
    /// # Errors
    ///
    /// [`GrantPastLimit`] when the credits would pass their limit: the peer granted
    /// receives it cannot have posted. Nothing is taken.
    pub(super) fn grant(&mut self, grant: Grant) -> Result<(), GrantPastLimit> {
        if grant.count == 0 {
            return Ok(());
        }
        let count = u32::from(grant.count);
        let past = GrantPastLimit {
            held: self.total,
            limit: self.limit,
        };
        self.total = self
            .total
            .checked_add(count)
            .filter(|&total| total <= self.limit)
            .ok_or(past)?;
        // A run is at most the total, which is within the limit.
        match self.runs.back_mut() {
            Some((tier, run)) if *tier == grant.tier => *run += count,
            _ => self.runs.push_back((grant.tier, count)),
        }
        Ok(())
    }

    /// All credits held.
    pub(super) fn total(&self) -> u32 {
        self.total
    }

    /// The tier of the receive the next frame lands in.
    pub(super) fn next_tier(&self) -> Option<u8> {
        self.runs.front().map(|&(tier, _)| tier)
    }

    /// Consumes the oldest credit and returns its tier.
    pub(super) fn take(&mut self) -> Option<u8> {
        let (tier, run) = self.runs.front_mut()?;
        let tier = *tier;
        *run -= 1;
        if *run == 0 {
            self.runs.pop_front();
        }
        self.total -= 1;
        Some(tier)
    }

    /// Whether a data frame may take a credit: all but the last [`RESERVED_CREDITS`].
    pub(super) fn has_data_credit(&self) -> bool {
        self.total > RESERVED_CREDITS
    }

    /// Whether every credit held is of `tier` (or none is held).
    pub(super) fn only_of(&self, tier: u8) -> bool {
        self.runs.iter().all(|&(run_tier, _)| run_tier == tier)
    }

    /// Credits up to and including the last one of a tier other than `tier` (0 without
    /// one): what must be consumed for no receive of another tier to stay posted.
    pub(super) fn through_last_not_of(&self, tier: u8) -> u32 {
        let mut taken = 0;
        let mut through = 0;
        for &(run_tier, run) in &self.runs {
            taken += run;
            if run_tier != tier {
                through = taken;
            }
        }
        through
    }

    /// Credits ahead of the first one of `tier`: the old receives a switch to `tier` must
    /// drain.
    pub(super) fn ahead_of(&self, tier: u8) -> u32 {
        self.runs
            .iter()
            .take_while(|&&(run_tier, _)| run_tier != tier)
            .map(|&(_, run)| run)
            .sum()
    }
}

/// How soon the peer must hear of a receive just posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Urgency {
    /// Soon: it stands for room that data, control or a dropped message freed.
    Soon,
    /// With whatever frame goes next: it replaces one a credit or drain frame consumed,
    /// and granting it at once would answer a credit frame with a credit frame.
    WithNextFrame,
}

/// Receives this side posted and has not granted to the peer yet, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PendingGrants {
    runs: VecDeque<(u8, u32)>,
    total: u32,
    /// Whether any pending receive was posted [`Urgency::Soon`].
    urgent: bool,
}

impl PendingGrants {
    /// Records `count` receives of `tier` just posted, as `urgency` says.
    pub(super) fn posted(&mut self, tier: u8, count: u32, urgency: Urgency) {
        if count == 0 {
            return;
        }
        self.urgent |= urgency == Urgency::Soon;
        match self.runs.back_mut() {
            Some((run_tier, run)) if *run_tier == tier => *run += count,
            _ => self.runs.push_back((tier, count)),
        }
        self.total += count;
    }

    /// Receives not yet granted.
    pub(super) fn total(&self) -> u32 {
        self.total
    }

    /// Whether a pending receive was posted [`Urgency::Soon`].
    pub(super) fn is_urgent(&self) -> bool {
        self.urgent
    }

    /// What [`PendingGrants::take`] would return, taking nothing.
    pub(super) fn peek(&self) -> Grant {
        match self.runs.front() {
            Some(&(tier, run)) => Grant {
                tier,
                count: run.min(u32::from(u16::MAX)) as u16,
            },
            None => Grant { tier: 0, count: 0 },
        }
    }

    /// The oldest run (at most `u16::MAX` of it) for the next frame's header; a zero grant
    /// when nothing is pending.
    pub(super) fn take(&mut self) -> Grant {
        let Some((tier, run)) = self.runs.front_mut() else {
            return Grant { tier: 0, count: 0 };
        };
        let tier = *tier;
        let count = (*run).min(u32::from(u16::MAX));
        *run -= count;
        if *run == 0 {
            self.runs.pop_front();
        }
        self.total -= count;
        self.urgent &= self.total > 0;
        Grant {
            tier,
            count: count as u16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grant(tier: u8, count: u16) -> Grant {
        Grant { tier, count }
    }

    #[test]
    fn credits_are_consumed_in_posting_order_and_the_last_is_kept() {
        let mut credits = Credits::new(u32::MAX);
        for each in [grant(0, 2), grant(1, 1), grant(1, 1), grant(0, 0)] {
            credits.grant(each).unwrap();
        }
        assert_eq!(credits.total(), 4);
        assert_eq!(credits.ahead_of(1), 2);
        assert_eq!(credits.ahead_of(0), 0);
        assert_eq!(credits.take(), Some(0));
        assert_eq!(credits.take(), Some(0));
        assert_eq!(credits.next_tier(), Some(1));
        assert!(credits.has_data_credit());
        assert_eq!(credits.take(), Some(1));
        assert!(!credits.has_data_credit(), "the last credit is reserved");
        assert_eq!(credits.take(), Some(1));
        assert_eq!(credits.take(), None);
        assert_eq!(credits.total(), 0);
    }

    #[test]
    fn a_grant_past_the_limit_is_refused_whole() {
        let mut credits = Credits::new(10);
        credits.grant(grant(0, 6)).unwrap();
        assert_eq!(
            credits.grant(grant(1, 5)),
            Err(GrantPastLimit { held: 6, limit: 10 })
        );
        assert_eq!((credits.total(), credits.next_tier()), (6, Some(0)));
        credits.grant(grant(1, 4)).unwrap();
        assert_eq!(credits.total(), 10);
        let mut full = Credits::new(u32::MAX);
        while full.total() <= u32::MAX - u32::from(u16::MAX) {
            full.grant(grant(0, u16::MAX)).unwrap();
        }
        assert!(full.grant(grant(0, u16::MAX)).is_err(), "no overflow");
    }

    #[test]
    fn pending_grants_leave_in_posting_order_and_split_large_runs() {
        let mut pending = PendingGrants::default();
        pending.posted(0, 3, Urgency::Soon);
        pending.posted(0, 2, Urgency::Soon);
        pending.posted(2, 70_000, Urgency::Soon);
        assert_eq!(pending.take(), grant(0, 5));
        assert_eq!(pending.take(), grant(2, u16::MAX));
        assert_eq!(
            pending.take(),
            grant(2, (70_000 - u32::from(u16::MAX)) as u16)
        );
        assert_eq!(pending.take(), grant(0, 0));
        assert_eq!(pending.total(), 0);
    }

    proptest! {
        /// Granting what was posted, in the order it left, reproduces the posting order.
        #[test]
        fn grants_reproduce_the_posting_order(posts in prop::collection::vec((0u8..4, 0u32..5), 0..40)) {
            let mut pending = PendingGrants::default();
            let mut credits = Credits::new(u32::MAX);
            let mut expected = Vec::new();
            for &(tier, count) in &posts {
                pending.posted(tier, count, Urgency::Soon);
                expected.extend(std::iter::repeat_n(tier, count as usize));
                if count % 2 == 0 {
                    credits.grant(pending.take()).unwrap();
                }
            }
            while pending.total() > 0 {
                credits.grant(pending.take()).unwrap();
            }
            prop_assert_eq!(credits.total() as usize, expected.len());
            let consumed: Vec<u8> = std::iter::from_fn(|| credits.take()).collect();
            prop_assert_eq!(consumed, expected);
        }
    }
}
