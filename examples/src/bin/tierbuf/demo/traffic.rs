//! The traffic each side runs: the clients keep one request in flight per connection and
//! time every round trip ([`run_clients`]), the servers answer each request with a reply of
//! the same size ([`serve`]); each side is one thread making rounds over all its
//! connections, and notes the peak of its process's registered bytes as it goes.
//! [`timed_traffic`] gives the traffic its request sizes, progress bar and clock;
//! [`QUIET_POLL`] and [`quiet_deadline`] pace the quiet phase after it.

use std::io::{IoSlice, IsTerminal};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tierbuf_pool::MemoryBudget;
use tierbuf_transport::Endpoint;
use tierbuf_transport::connection::{Connection, SendError};

use super::DemoError;
use super::args::DemoArgs;
use super::messages::{CLASSES, MessageSizes, check, fill};
use super::setup::{Setup, Side};

/// How long the quiet phase sleeps between two rounds of progress.
pub(super) const QUIET_POLL: Duration = Duration::from_millis(5);

/// When the quiet phase gives up waiting for every connection to step back down.
pub(super) fn quiet_deadline(args: &DemoArgs) -> Instant {
    Instant::now() + (args.demote_after + args.hysteresis) * 3
}

/// The progress bar of the round trips, drawn only on a terminal.
fn progress_bar(args: &DemoArgs) -> Result<ProgressBar, DemoError> {
    let bar = ProgressBar::with_draw_target(
        Some((args.connections * args.messages) as u64),
        if std::io::stdout().is_terminal() {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} round trips {elapsed}",
    )?);
    Ok(bar)
}

/// Runs `traffic` with the request sizes of the run `args` and `setup` describe and a
/// progress bar of its round trips; returns what `traffic` returns and how long it took.
pub(super) fn timed_traffic<T>(
    args: &DemoArgs,
    setup: &Setup,
    traffic: impl FnOnce(&MessageSizes, &ProgressBar) -> Result<T, DemoError>,
) -> Result<(T, Duration), DemoError> {
    let bar = progress_bar(args)?;
    let sizes = MessageSizes::new(&setup.ladder, args.large_every, args.seed);
    let started = Instant::now();
    let result = traffic(&sizes, &bar)?;
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    Ok((result, elapsed))
}

/// The client side: one request in flight per connection; returns round-trip times in
/// nanoseconds per size class.
pub(super) fn run_clients<E: Endpoint>(
    side: &mut Side<E>,
    messages: usize,
    sizes: &MessageSizes,
    bar: &ProgressBar,
    budget: &MemoryBudget,
    peak: &AtomicU64,
) -> Result<[Vec<u64>; CLASSES], DemoError> {
    let count = side.connections.len();
    let mut next = vec![0usize; count];
    let mut in_flight: Vec<Option<(usize, Instant, bool)>> = vec![None; count];
    let mut latencies: [Vec<u64>; CLASSES] = Default::default();
    let (mut buffer, mut scratch) = (Vec::new(), Vec::new());
    let mut done = 0;
    let mut peak_watch = PeakWatch::new(budget, peak);
    while done < count {
        done = 0;
        for (index, connection) in side.connections.iter_mut().enumerate() {
            if let Some((sequence, started, false)) = in_flight[index] {
                let len = sizes.size(index, sequence);
                fill(&mut buffer, index, sequence, false, len);
                if offer(connection, &buffer)? {
                    in_flight[index] = Some((sequence, started, true));
                } else {
                    connection.progress()?;
                }
            }
            if let Some((sequence, started, true)) = in_flight[index]
                && let Some(reply) = connection.try_recv()?
            {
                let len = sizes.size(index, sequence);
                if reply.len() != len {
                    return Err(format!(
                        "connection {index}: reply {sequence} is {} bytes, not {len}",
                        reply.len()
                    )
                    .into());
                }
                check(&reply, index, sequence, true, &mut scratch)?;
                latencies[sizes.class(len)].push(started.elapsed().as_nanos() as u64);
                in_flight[index] = None;
                bar.inc(1);
            }
            if in_flight[index].is_none() {
                if next[index] == messages {
                    done += 1;
                    connection.progress()?;
                    continue;
                }
                in_flight[index] = Some((next[index], Instant::now(), false));
                next[index] += 1;
            }
        }
        peak_watch.round_done();
    }
    Ok(latencies)
}

/// The server side: answers every request with a reply of the same size.
pub(super) fn serve<E: Endpoint>(
    side: &mut Side<E>,
    messages: usize,
    budget: &MemoryBudget,
    peak: &AtomicU64,
) -> Result<(), DemoError> {
    let count = side.connections.len();
    let mut answered = vec![0usize; count];
    let mut pending: Vec<Option<Vec<u8>>> = vec![None; count];
    let mut scratch = Vec::new();
    let mut peak_watch = PeakWatch::new(budget, peak);
    while answered.iter().any(|&n| n < messages) || pending.iter().any(Option::is_some) {
        for (index, connection) in side.connections.iter_mut().enumerate() {
            if let Some(reply) = &pending[index] {
                if offer(connection, reply)? {
                    pending[index] = None;
                } else {
                    connection.progress()?;
                    continue;
                }
            }
            if let Some(request) = connection.try_recv()? {
                let sequence = answered[index];
                check(&request, index, sequence, false, &mut scratch)?;
                let mut reply = Vec::new();
                fill(&mut reply, index, sequence, true, request.len());
                drop(request);
                answered[index] += 1;
                if !offer(connection, &reply)? {
                    pending[index] = Some(reply);
                }
            }
        }
        peak_watch.round_done();
    }
    for connection in &mut side.connections {
        connection.flush()?;
    }
    Ok(())
}

/// Sends `bytes` on `connection` if it is accepted now; `Ok(false)` when it would block.
fn offer<E: Endpoint>(connection: &mut Connection<E>, bytes: &[u8]) -> Result<bool, DemoError> {
    match connection.try_send(&[IoSlice::new(bytes)]) {
        Ok(accepted) if accepted == bytes.len() => Ok(true),
        Ok(accepted) => {
            Err(format!("a single-element message was split at {accepted} bytes").into())
        }
        Err(SendError::WouldBlock(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// The rounds over a side's connections between two readings of the registered bytes for
/// their peak.
const ROUNDS_PER_PEAK_READING: u64 = 64;

/// Keeps `peak` at the most registered bytes `budget` has shown, reading them once every
/// [`ROUNDS_PER_PEAK_READING`] rounds over a side's connections.
struct PeakWatch<'a> {
    budget: &'a MemoryBudget,
    peak: &'a AtomicU64,
    rounds: u64,
}

impl<'a> PeakWatch<'a> {
    fn new(budget: &'a MemoryBudget, peak: &'a AtomicU64) -> PeakWatch<'a> {
        PeakWatch {
            budget,
            peak,
            rounds: 0,
        }
    }

    /// Counts a round over the side's connections, and reads the registered bytes if it
    /// is time.
    fn round_done(&mut self) {
        self.rounds += 1;
        if self.rounds.is_multiple_of(ROUNDS_PER_PEAK_READING) {
            self.peak.fetch_max(self.budget.in_use(), Ordering::Relaxed);
        }
    }
}
