//! [`TierStats`]: what one side's tier negotiation did.

/// What one side of a connection's tier negotiation did, counted since the connection
/// started: the promotions and demotions of its send tier, the requests refused, and the
/// messages sent without waiting for a tier. A connection reports it as
/// `ConnectionStats::tiers` (`tierbuf-transport`).
///
/// ```
/// use tierbuf_tiers::TierStats;
/// let stats = TierStats::default();
/// assert_eq!(stats.promotions + stats.demotions, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Changes to a higher send tier.
    pub promotions: u64,
    /// Changes to a lower send tier.
    pub demotions: u64,
    /// Tier requests the peer refused (nacked).
    pub nacks: u64,
    /// Tier requests given up unanswered (timed out).
    pub timeouts: u64,
    /// Times this side's budget refused send buffers for a tier the peer granted: frames
    /// then stay at the smaller tier, segmenting what does not fit.
    pub send_buffers_refused: u64,
    /// Times this side's budget (or ladder) refused receive buffers the peer asked for:
    /// the peer's request was nacked.
    pub recv_buffers_refused: u64,
    /// Messages (and runs of a batch) that needed a larger tier and went out on the tier
    /// in force without asking, because a refusal of that tier (a nack, a timeout, or this
    /// side's budget refusing send buffers) held its back-off.
    pub held_back_by_refusal: u64,
    /// Messages (and runs of a batch) that needed a larger tier while this side's
    /// demotion was pending: they go out on the tier in force, and the promotion is asked
    /// once the demotion lands.
    pub held_back_by_demotion: u64,
    /// The peer's tier requests answered `Busy` because a receive tier they replaced was
    /// still draining (the peer had not sent into its receives yet): what bounds a peer
    /// that asks tier after tier to two receive tiers.
    pub recv_requests_busy: u64,
}
