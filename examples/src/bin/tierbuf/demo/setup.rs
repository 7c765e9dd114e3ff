//! What a run sets up before its traffic and checks after it: the [`Setup`] both sides
//! of every connection agree on and the transport built from it, the [`Side`]s of
//! connections made through that transport, and the check that every registered byte
//! came back.

use std::collections::HashMap;
use std::sync::Arc;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionId, ConnectionTable, SharedConnection};
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

/// One client or server side: its connections in a [`ConnectionTable`], whose readiness
/// tells the side's thread which of them have work; connection `i` of one side is the
/// peer of connection `i` of the other.
pub(super) struct Side<E: Endpoint + 'static> {
    pub(super) table: ConnectionTable<E>,
    /// The connections by index.
    pub(super) connections: Vec<SharedConnection<E>>,
    /// The index of each connection, by its id in the table.
    indices: HashMap<ConnectionId, usize>,
}

impl<E: Endpoint + 'static> Side<E> {
    pub(super) fn with_capacity(count: usize) -> Side<E> {
        Side {
            table: ConnectionTable::new(),
            connections: Vec::with_capacity(count),
            indices: HashMap::with_capacity(count),
        }
    }

    /// A side of `count` connections, connection `i` made by `connect(i)`.
    pub(super) fn connect(
        count: usize,
        mut connect: impl FnMut(usize) -> Result<Connection<E>, DemoError>,
    ) -> Result<Side<E>, DemoError> {
        let mut side = Side::with_capacity(count);
        for index in 0..count {
            side.push(connect(index)?);
        }
        Ok(side)
    }

    /// Adds `connection` as the next index.
    pub(super) fn push(&mut self, connection: Connection<E>) {
        let shared = self.table.insert(connection);
        self.indices.insert(shared.id(), self.connections.len());
        self.connections.push(shared);
    }

    /// The index of the connection `shared` names.
    pub(super) fn index_of(&self, shared: &SharedConnection<E>) -> usize {
        self.indices[&shared.id()]
    }

    /// One round of progress on every connection.
    pub(super) fn progress(&mut self) -> Result<(), DemoError> {
        for connection in &self.connections {
            connection.lock()?.progress()?;
        }
        Ok(())
    }

    /// The counters of every connection, summed.
    pub(super) fn totals(&self) -> Result<Totals, DemoError> {
        let mut totals = Totals::default();
        for connection in &self.connections {
            let stats = connection.lock()?.stats();
            totals = totals
                + Totals {
                    promotions: stats.tiers.promotions,
                    demotions: stats.tiers.demotions,
                    nacks: stats.tiers.nacks,
                    messages: stats.messages_sent,
                    bytes: stats.bytes_sent,
                    send_tier_sum: u64::from(stats.send_tier),
                };
        }
        Ok(totals)
    }
}

/// Fails unless every registered byte has come back to `budget`.
pub(super) fn check_returned(budget: &MemoryBudget) -> Result<(), DemoError> {
    match budget.in_use() {
        0 => Ok(()),
        left => Err(format!("{left} registered bytes were not returned").into()),
    }
}
