//! The readiness model (`mod.rs`) for a listener's accept, where there is no connection
//! yet to arm. The peers of a listener whose peers connect before they speak (the shm bootstrap
//! socket, the verbs TCP rendezvous): peers taken from the kernel wait in the listener's
//! [`UnheardPeers`], each for a patience of the listener's, and the listener sleeps until
//! one of them speaks, a new one connects, or the oldest one's patience is spent. So a
//! peer that connects and says nothing holds up no other.
//!
//! # Invariants
//!
//! - Peers are kept oldest first, each with the instant it was taken, so a listener
//!   hands out, among those that have spoken, the one that connected first, and drops a
//!   silent one no later than its patience after it was taken (the wait never sleeps past
//!   the oldest one's).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

/// Peers connected to a listener that have said nothing yet, oldest first.
#[derive(Debug)]
pub(crate) struct UnheardPeers<S> {
    peers: VecDeque<(S, Instant)>,
}

impl<S: AsFd> UnheardPeers<S> {
    /// None yet.
    pub(crate) fn new() -> UnheardPeers<S> {
        UnheardPeers {
            peers: VecDeque::new(),
        }
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// A peer just taken from the kernel.
    pub(crate) fn push(&mut self, peer: S) {
        self.peers.push_back((peer, Instant::now()));
    }

    /// The oldest peer of which `heard` says it has spoken (or gone), with what it said;
    /// the peer leaves the list.
    pub(crate) fn take_heard<H>(
        &mut self,
        mut heard: impl FnMut(&S) -> Option<H>,
    ) -> Option<(S, H)> {
        let (index, said) = self
            .peers
            .iter()
            .enumerate()
            .find_map(|(index, (peer, _))| heard(peer).map(|said| (index, said)))?;
        let (peer, _) = self.peers.remove(index).expect("the peer just heard");
        Some((peer, said))
    }

    /// Drops (and so closes) the oldest peer silent for `patience`, if one is; true when
    /// it did.
    pub(crate) fn drop_silent(&mut self, patience: Duration) -> bool {
        let now = Instant::now();
        let silent = self
            .peers
            .iter()
            .position(|(_, since)| now.saturating_duration_since(*since) >= patience);
        silent.and_then(|index| self.peers.remove(index)).is_some()
    }

    /// Sleeps in `poll(2)` until a peer connects to `listener` (when it is given: a
    /// listener out of descriptors would wake the wait at once for a connection it cannot
    /// take), one of these peers sends something or goes, or the oldest one has waited
    /// `patience` since it was taken. A signal ends the wait early, as if something had
    /// come, and so does an hour's wait.
    ///
    /// # Errors
    ///
    /// What `poll(2)` fails with, but an interruption.
    pub(crate) fn wait<L: AsFd>(
        &self,
        listener: Option<&L>,
        patience: Duration,
    ) -> rustix::io::Result<()> {
        let now = Instant::now();
        let mut watched: Vec<PollFd<'_>> = listener
            .map(|listener| PollFd::new(listener, PollFlags::IN))
            .into_iter()
            .chain(
                self.peers
                    .iter()
                    .map(|(peer, _)| PollFd::new(peer, PollFlags::IN)),
            )
            .collect();
        let timeout = self
            .peers
            .front()
            .map(|(_, oldest)| patience.saturating_sub(now.saturating_duration_since(*oldest)));
        super::poll_for(&mut watched, timeout)
    }
}
