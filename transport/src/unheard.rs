//! The wait of a listener whose peers connect before they speak (the shm bootstrap
//! socket, the verbs TCP rendezvous): peers taken from the kernel wait in the listener's
//! list of the unheard, each for a patience of the listener's, and the listener sleeps
//! until one of them speaks, a new one connects, or the oldest one's patience is spent.
//! So a peer that connects and says nothing holds up no other.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

/// Sleeps in `poll(2)` until a peer connects to `listener` (when it is given: a listener
/// out of descriptors would wake the wait at once for a connection it cannot take), one
/// of the `unheard` peers (each with the instant it was taken) sends something or goes,
/// or the oldest one has waited `patience` since it was taken. A signal ends the wait
/// early, as if something had come.
///
/// # Errors
///
/// What `poll(2)` fails with, but an interruption.
pub(crate) fn wait_for_peers<'a, L: AsFd, S: AsFd + 'a>(
    listener: Option<&L>,
    unheard: impl Iterator<Item = (&'a S, Instant)>,
    patience: Duration,
    now: Instant,
) -> rustix::io::Result<()> {
    let mut left = None::<Duration>;
    let mut watched: Vec<PollFd<'_>> = listener
        .map(|listener| PollFd::new(listener, PollFlags::IN))
        .into_iter()
        .collect();
    for (peer, since) in unheard {
        let remaining = patience.saturating_sub(now.saturating_duration_since(since));
        left = Some(left.map_or(remaining, |left| left.min(remaining)));
        watched.push(PollFd::new(peer, PollFlags::IN));
    }
    let timeout = left.map(|left| {
        Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        })
    });
    match rustix::event::poll(&mut watched, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(errno) => Err(errno),
    }
}
