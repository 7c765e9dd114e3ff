//! The traffic each side runs: the clients keep one request in flight per connection and
//! time every round trip ([`run_clients`]), the servers answer each request with a reply of
//! the same size ([`serve`]); each side is one thread that sleeps until some of its
//! connections have work (their table's readiness) and looks only at those. The peak of
//! registered bytes is the budget's own
//! ([`MemoryBudget::peak`](tierbuf_pool::MemoryBudget::peak)).
//! [`timed_traffic`] gives the traffic its request sizes, progress bar and clock;
//! [`QUIET_POLL`] and [`quiet_deadline`] pace the quiet phase after it.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tierbuf_transport::Endpoint;
use tierbuf_transport::connection::{Connection, SendError, SharedConnection};

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

/// How long a side waits for any of its connections before it looks at the clock: a
/// side that has waited [`STALL_LIMIT`] with nothing ready gives up.
const READY_WAIT: Duration = Duration::from_secs(1);

/// How long a side may find none of its connections ready before the run fails.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Waits until some of `side`'s connections may have work, and puts them in `ready`;
/// fails when none has for [`STALL_LIMIT`].
fn wait_ready<E: Endpoint>(
    side: &Side<E>,
    ready: &mut Vec<SharedConnection<E>>,
) -> Result<(), DemoError> {
    let since = Instant::now();
    while side.table.wait_ready(ready, READY_WAIT)? == 0 {
        if since.elapsed() >= STALL_LIMIT {
            return Err(format!("no connection had work for {STALL_LIMIT:?}").into());
        }
    }
    Ok(())
}

/// One client connection's request in flight: its sequence number, when it was made,
/// and whether it has been sent.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    sequence: usize,
    started: Instant,
    sent: bool,
}

/// The client side: one request in flight per connection; returns round-trip times in
/// nanoseconds per size class. The thread sleeps until a connection has a reply or room
/// to send ([`ConnectionTable::wait_ready`](tierbuf_transport::connection::ConnectionTable::wait_ready)),
/// so a round trip is timed by the transport's wake, not by a sweep over every
/// connection.
pub(super) fn run_clients<E: Endpoint>(
    side: &mut Side<E>,
    messages: usize,
    sizes: &MessageSizes,
    bar: &ProgressBar,
) -> Result<[Vec<u64>; CLASSES], DemoError> {
    let count = side.connections.len();
    let mut next = vec![0usize; count];
    let mut in_flight: Vec<Option<InFlight>> = vec![None; count];
    let mut latencies: [Vec<u64>; CLASSES] = Default::default();
    let (mut buffer, mut scratch) = (Vec::new(), Vec::new());
    let mut done = 0;
    let mut ready: Vec<_> = side.connections.clone();
    while done < count {
        for shared in &ready {
            let index = side.index_of(shared);
            let mut connection = shared.lock()?;
            loop {
                match in_flight[index] {
                    Some(request @ InFlight { sent: false, .. }) => {
                        let len = sizes.size(index, request.sequence);
                        fill(&mut buffer, index, request.sequence, false, len);
                        if !offer(&mut connection, &buffer)? {
                            break;
                        }
                        in_flight[index] = Some(InFlight {
                            sent: true,
                            ..request
                        });
                    }
                    Some(request) => {
                        let Some(reply) = connection.try_recv()? else {
                            break;
                        };
                        let len = sizes.size(index, request.sequence);
                        if reply.len() != len {
                            return Err(format!(
                                "connection {index}: reply {} is {} bytes, not {len}",
                                request.sequence,
                                reply.len()
                            )
                            .into());
                        }
                        check(&reply, index, request.sequence, true, &mut scratch)?;
                        latencies[sizes.class(len)]
                            .push(request.started.elapsed().as_nanos() as u64);
                        in_flight[index] = None;
                        bar.inc(1);
                    }
                    None if next[index] == messages => {
                        done += 1;
                        next[index] += 1;
                        break;
                    }
                    None if next[index] > messages => break,
                    None => {
                        in_flight[index] = Some(InFlight {
                            sequence: next[index],
                            started: Instant::now(),
                            sent: false,
                        });
                        next[index] += 1;
                    }
                }
            }
        }
        if done < count {
            wait_ready(side, &mut ready)?;
        }
    }
    Ok(latencies)
}

/// The server side: answers every request with a reply of the same size, looking only at
/// the connections that may have a request or room for a reply.
pub(super) fn serve<E: Endpoint>(side: &mut Side<E>, messages: usize) -> Result<(), DemoError> {
    let count = side.connections.len();
    let mut answered = vec![0usize; count];
    let mut pending: Vec<Option<Vec<u8>>> = vec![None; count];
    let mut scratch = Vec::new();
    let mut finished = 0;
    let mut ready = Vec::new();
    while finished < count {
        wait_ready(side, &mut ready)?;
        for shared in &ready {
            let index = side.index_of(shared);
            let mut connection = shared.lock()?;
            let was_finished = answered[index] == messages && pending[index].is_none();
            if let Some(reply) = &pending[index] {
                if !offer(&mut connection, reply)? {
                    continue;
                }
                pending[index] = None;
            }
            while let Some(request) = connection.try_recv()? {
                let sequence = answered[index];
                check(&request, index, sequence, false, &mut scratch)?;
                let mut reply = Vec::new();
                fill(&mut reply, index, sequence, true, request.len());
                drop(request);
                answered[index] += 1;
                if !offer(&mut connection, &reply)? {
                    pending[index] = Some(reply);
                    break;
                }
            }
            if !was_finished && answered[index] == messages && pending[index].is_none() {
                finished += 1;
            }
        }
    }
    for connection in &side.connections {
        connection.lock()?.flush()?;
    }
    Ok(())
}

/// Sends `bytes` on `connection` if it is accepted now; `Ok(false)` when it would block.
fn offer<E: Endpoint>(connection: &mut Connection<E>, bytes: &[u8]) -> Result<bool, DemoError> {
    match connection.try_send(bytes) {
        Ok(()) => Ok(true),
        Err(SendError::WouldBlock(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
