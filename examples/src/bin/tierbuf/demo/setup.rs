//! What a run sets up before its traffic and checks after it: the [`Setup`] both sides
//! of every connection agree on and the transport built from it, the [`Side`]s of
//! connections made through that transport, and the check that every registered byte
//! came back.

use std::ops::Add;
use std::sync::Arc;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::Connection;
use tierbuf_transport::{Endpoint, Kind, Transport, TransportBuilder};

use super::DemoError;
use super::args::DemoArgs;
use super::figures::Totals;

/// What both sides of every connection agree on.
#[derive(Debug)]
pub(super) struct Setup {
    /// The ladder's name in the report.
    pub(super) name: String,
    /// The ladder, with the demo's demotion timing.
    pub(super) ladder: Arc<TierLadder>,
}

impl Setup {
    /// The setup `args` ask for, and the transport `builder` builds with it: the ladder
    /// with the demo's demotion timing, a budget from the system's limits, and room for
    /// `--connections` connections (the open-file limit raised if it must be, a process
    /// started afterwards inheriting it).
    pub(super) fn build<K: Kind>(
        args: &DemoArgs,
        builder: TransportBuilder<K>,
    ) -> Result<(Setup, Transport<K>), DemoError> {
        if args.connections == 0 || args.messages == 0 || args.large_every == 0 {
            return Err("--connections, --messages and --large-every must be at least 1".into());
        }
        let (name, builder) = match &args.ladder {
            Some(path) => (path.display().to_string(), builder.ladder_file(path)),
            None => (
                format!("preset {}", args.preset),
                builder.ladder_preset(&args.preset),
            ),
        };
        let transport = builder
            .demote_after(args.demote_after)
            .hysteresis(args.hysteresis)
            .connections(args.connections)
            .build()?;
        let setup = Setup {
            name,
            ladder: Arc::clone(transport.ladder()),
        };
        Ok((setup, transport))
    }
}

/// One client or server side: its connections, connection `i` of one side being the peer
/// of connection `i` of the other.
pub(super) struct Side<E: Endpoint> {
    pub(super) connections: Vec<Connection<E>>,
}

impl<E: Endpoint> Side<E> {
    pub(super) fn with_capacity(count: usize) -> Side<E> {
        Side {
            connections: Vec::with_capacity(count),
        }
    }

    /// A side of `count` connections, connection `i` made by `connect(i)`.
    pub(super) fn connect(
        count: usize,
        connect: impl FnMut(usize) -> Result<Connection<E>, DemoError>,
    ) -> Result<Side<E>, DemoError> {
        Ok(Side {
            connections: (0..count).map(connect).collect::<Result<_, _>>()?,
        })
    }

    /// One round of progress on every connection.
    pub(super) fn progress(&mut self) -> Result<(), DemoError> {
        for connection in &mut self.connections {
            connection.progress()?;
        }
        Ok(())
    }

    /// The counters of every connection, summed.
    pub(super) fn totals(&self) -> Totals {
        self.connections
            .iter()
            .map(|connection| {
                let stats = connection.stats();
                Totals {
                    promotions: stats.promotions,
                    demotions: stats.demotions,
                    nacks: stats.nacks,
                    messages: stats.messages_sent,
                    bytes: stats.bytes_sent,
                    send_tier_sum: u64::from(stats.send_tier),
                }
            })
            .fold(Totals::default(), Add::add)
    }
}

/// Fails unless every registered byte has come back to `budget`.
pub(super) fn check_returned(budget: &MemoryBudget) -> Result<(), DemoError> {
    match budget.in_use() {
        0 => Ok(()),
        left => Err(format!("{left} registered bytes were not returned").into()),
    }
}
