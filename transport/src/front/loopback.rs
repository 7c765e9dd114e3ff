//! The front door's loopback glue: addresses are names within a transport value.

use std::collections::HashMap;
use std::fmt;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tierbuf_pool::{MemlockPolicy, MemoryBudget};

use super::builder::{Transport, TransportBuilder};
use super::error::SetupError;
use super::listener::{Incoming, Listener};
use super::{ConnectionOf, Kind, OpenFiles, sealed};
use crate::loopback::{LoopbackEndpoint, LoopbackProvider, MAX_QUEUE_DEPTH};

/// The names listened at, each with its listener's queue.
type Names = Mutex<HashMap<String, Sender<Incoming<Loopback>>>>;

/// The loopback provider as a front-door [`Kind`]: both ends of every connection in this
/// process; a listener's address is a name, known to the transport it was listened on
/// and its clones.
pub struct Loopback {
    names: Arc<Names>,
}

impl sealed::Sealed for Loopback {}

impl Kind for Loopback {
    type Endpoint = LoopbackEndpoint;
    type Provider = LoopbackProvider;
    const NAME: &'static str = "loopback";
    const MEMLOCK: MemlockPolicy = MemlockPolicy::Ignore;

    fn max_depth(&self) -> u32 {
        MAX_QUEUE_DEPTH
    }

    fn open(&self, budget: &MemoryBudget) -> Result<LoopbackProvider, SetupError> {
        Ok(LoopbackProvider::new(budget.clone()))
    }

    fn open_files(&self) -> Option<OpenFiles> {
        None
    }
}

impl fmt::Debug for Loopback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Loopback")
            .field("names", &names.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Transport<Loopback> {
    /// A builder for a transport over the in-process [`LoopbackProvider`].
    pub fn loopback() -> TransportBuilder<Loopback> {
        TransportBuilder::new(Loopback {
            names: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// Listens at the name `name`.
    ///
    /// # Errors
    ///
    /// [`SetupError::AddressInUse`] while another listener of this transport has the
    /// name.
    pub fn listen(&self, name: &str) -> Result<Listener<Loopback>, SetupError> {
        let mut names = self.names().lock().unwrap_or_else(PoisonError::into_inner);
        if names.contains_key(name) {
            return Err(SetupError::AddressInUse {
                address: name.to_owned(),
            });
        }
        let (queue, incoming) = mpsc::channel();
        names.insert(name.to_owned(), queue);
        let taken = Name {
            names: Arc::clone(self.names()),
            name: name.to_owned(),
        };
        Ok(Listener::new(
            Arc::clone(&self.shared),
            name.to_owned(),
            incoming,
            Box::new(taken),
        ))
    }

    /// Connects to the listener at `name`: a pair of endpoints, one for this connection
    /// and one queued for the listener's `accept`. It does not wait for the `accept`.
    ///
    /// # Errors
    ///
    /// [`SetupError::NoListener`] when no listener of this transport has the name;
    /// [`SetupError::Provider`] when the endpoints could not be made;
    /// [`SetupError::Config`] or [`SetupError::Connection`] when the connection over them
    /// could not start.
    pub fn connect(&self, name: &str) -> Result<ConnectionOf<Loopback>, SetupError> {
        let no_listener = || SetupError::NoListener {
            address: name.to_owned(),
            source: None,
        };
        let queue = self
            .names()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(no_listener)?;
        let depth = self.shared.depth();
        let (ours, theirs) =
            self.shared
                .provider
                .pair(depth, depth)
                .map_err(|source| SetupError::Provider {
                    provider: Loopback::NAME,
                    operation: "pairing endpoints",
                    source,
                })?;
        let connection = self.shared.connection(ours)?;
        queue.send(Ok(theirs)).map_err(|_| no_listener())?;
        Ok(connection)
    }

    /// `connect`: a loopback connect never waits, so the timeout bounds nothing; here so
    /// that code written for a provider that waits runs on loopback too.
    pub fn connect_timeout(
        &self,
        name: &str,
        _timeout: Duration,
    ) -> Result<ConnectionOf<Loopback>, SetupError> {
        self.connect(name)
    }

    fn names(&self) -> &Arc<Names> {
        &self.shared.kind.names
    }
}

/// A name a listener holds; dropping it frees the name.
struct Name {
    names: Arc<Names>,
    name: String,
}

impl Drop for Name {
    fn drop(&mut self) {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name);
    }
}
