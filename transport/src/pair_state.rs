//! The state word two endpoints of a connection share: open, closed by one side, or
//! broken. The loopback provider keeps it in process memory, the shared-memory provider
//! in the connection segment both processes map.
//!
//! # Invariants
//!
//! - The word leaves `OPEN` once, by a sequentially consistent compare-and-swap, and never
//!   changes again: a connection closed or broken keeps its first reason.
//! - It is one 32-bit atomic (`repr(transparent)`), and all zeroes is `OPEN`, so a zeroed
//!   shared mapping holds an open connection; any other value a peer writes reads as
//!   broken, never as undefined.

use crate::provider::EndpointState;
use crate::sync::{AtomicU32, Ordering};

const OPEN: u32 = 0;
const CLOSED_BY_SIDE_0: u32 = 1;
const CLOSED_BY_SIDE_1: u32 = 2;
const BROKEN: u32 = 3;

/// A connection's state as the word holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairState {
    /// Both sides open.
    Open,
    /// Closed by side 0 or side 1.
    ClosedBy(usize),
    /// An error broke the connection.
    Broken,
}

impl PairState {
    /// The state as the endpoint of `side` reports it.
    pub(crate) fn seen_by(self, side: usize) -> EndpointState {
        match self {
            PairState::Open => EndpointState::Open,
            PairState::ClosedBy(closer) if closer == side => EndpointState::Closed,
            PairState::ClosedBy(_) => EndpointState::PeerClosed,
            PairState::Broken => EndpointState::Broken,
        }
    }
}

/// The shared state word.
#[repr(transparent)]
#[derive(Debug)]
pub(crate) struct StateWord(AtomicU32);

impl StateWord {
    pub(crate) fn new() -> StateWord {
        StateWord(AtomicU32::new(OPEN))
    }

    pub(crate) fn load(&self) -> PairState {
        match self.0.load(Ordering::SeqCst) {
            OPEN => PairState::Open,
            CLOSED_BY_SIDE_0 => PairState::ClosedBy(0),
            CLOSED_BY_SIDE_1 => PairState::ClosedBy(1),
            _ => PairState::Broken,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.load() == PairState::Open
    }

    /// Moves an open connection to closed by `side`.
    pub(crate) fn close(&self, side: usize) {
        self.leave_open([CLOSED_BY_SIDE_0, CLOSED_BY_SIDE_1][side]);
    }

    /// Moves an open connection to broken.
    pub(crate) fn break_connection(&self) {
        self.leave_open(BROKEN);
    }

    fn leave_open(&self, to: u32) {
        // A connection already closed or broken keeps its first reason.
        let _ = self
            .0
            .compare_exchange(OPEN, to, Ordering::SeqCst, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_sticks_and_each_side_sees_it_from_its_end() {
        let word = StateWord::new();
        assert!(word.is_open());
        word.close(1);
        word.break_connection();
        word.close(0);
        assert_eq!(word.load(), PairState::ClosedBy(1));
        assert_eq!(word.load().seen_by(1), EndpointState::Closed);
        assert_eq!(word.load().seen_by(0), EndpointState::PeerClosed);
        let broken = StateWord::new();
        broken.break_connection();
        broken.close(0);
        assert_eq!(broken.load().seen_by(0), EndpointState::Broken);
    }
}
