//! The server: answers each connection's requests from a [`Store`], one thread per
//! connection, until its client hangs up; [`run_shm_server`] is the whole server process
//! of a run over shm.

use std::io::{IoSlice, Write};
use std::path::Path;
use std::time::Duration;

use redb::AccessGuard;
use tierbuf_transport::connection::{Connection, ConnectionError};
use tierbuf_transport::{Endpoint, Transport};

use super::memory::Sampler;
use super::store::{Store, StoreError};
use super::wire::{self, Reply, Request, Status};
use super::{KvError, Setup, returned};

/// How often each side samples its registered memory.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(5);
/// How long the server process waits for each of the client's connections.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);
/// The line the server process writes on its stdout once it listens.
pub const LISTENING: &str = "listening";

/// The body of a reply, owned or read in place from the store.
enum Body {
    Empty,
    Text(String),
    Stored(AccessGuard<'static, &'static [u8]>),
    Bytes(Vec<u8>),
}

impl Body {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Empty => &[],
            Body::Text(text) => text.as_bytes(),
            Body::Stored(guard) => guard.value(),
            Body::Bytes(bytes) => bytes,
        }
    }
}

/// The reply to `message`: a malformed request is answered with BAD REQUEST and a failed
/// store with STORE FAILED, saying why.
fn answer(message: &[u8], store: &Store, sampler: &Sampler) -> (Status, Body) {
    let failed = |error: StoreError| (Status::StoreFailed, Body::Text(error.to_string()));
    match Request::decode(message) {
        Err(error) => (Status::BadRequest, Body::Text(error.to_string())),
        Ok(Request::Put { key, value }) => match store.put(key, value) {
            Ok(()) => (Status::Ok, Body::Empty),
            Err(error) => failed(error),
        },
        Ok(Request::Get { key }) => match store.get(key) {
            Ok(Some(value)) => (Status::Ok, Body::Stored(value)),
            Ok(None) => (Status::NotFound, Body::Empty),
            Err(error) => failed(error),
        },
        Ok(Request::Delete { key }) => match store.delete(key) {
            Ok(true) => (Status::Ok, Body::Empty),
            Ok(false) => (Status::NotFound, Body::Empty),
            Err(error) => failed(error),
        },
        Ok(Request::Stats) => (
            Status::Ok,
            Body::Bytes(wire::encode_samples(&sampler.samples())),
        ),
    }
}

/// Answers `connection`'s requests until its client hangs up (then `Ok`).
///
/// # Errors
///
/// [`KvError::Receive`] when the connection fails otherwise, [`KvError::Send`] when a
/// reply cannot be sent.
pub fn serve_connection<E: Endpoint>(
    index: usize,
    connection: &mut Connection<E>,
    store: &Store,
    sampler: &Sampler,
) -> Result<(), KvError> {
    loop {
        let request = match connection.recv() {
            Ok(request) => request,
            Err(error) if matches!(*error, ConnectionError::PeerClosed) => return Ok(()),
            Err(source) => {
                return Err(KvError::Receive {
                    connection: index,
                    source,
                });
            }
        };
        let (status, body) = answer(&request, store, sampler);
        // The receive slot goes back before the reply is sent.
        drop(request);
        let body = body.bytes();
        let header = Reply { status, body }.header();
        connection
            .send_gather(&[IoSlice::new(&header), IoSlice::new(body)])
            .map_err(|source| KvError::Send {
                connection: index,
                source,
            })?;
    }
}

/// Serves every connection on a thread of its own until each client hangs up.
///
/// # Errors
///
/// The first connection's error, by index.
pub fn serve<E: Endpoint>(
    connections: Vec<Connection<E>>,
    store: &Store,
    sampler: &Sampler,
) -> Result<(), KvError> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(index, mut connection)| {
                scope.spawn(move || serve_connection(index, &mut connection, store, sampler))
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|thread| thread.join().map_err(|_| KvError::Panicked("server"))?)
    })
}

/// The server process of a run over shm: listens at `socket`, writes [`LISTENING`] on its
/// stdout, accepts `setup.connections` connections, serves them until the client hangs up,
/// and checks that every registered byte came back. It exits at once, failing, when its
/// stdin closes first: the client that started it is gone.
///
/// # Errors
///
/// Setting up, accepting or serving, the store's, or [`KvError::Leaked`].
pub fn run_shm_server(socket: &Path, setup: &Setup) -> Result<(), KvError> {
    let transport = setup.transport(Transport::shm())?;
    let budget = transport.budget().clone();
    let sampler = Sampler::start(budget.clone(), SAMPLE_PERIOD);
    let store = Store::create_temporary().map_err(|source| KvError::Store { source })?;
    let listener = transport.listen(socket).map_err(|source| KvError::Setup {
        source: Box::new(source),
    })?;
    exit_when_stdin_closes();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{LISTENING}")
        .and_then(|()| stdout.flush())
        .map_err(|source| KvError::Process {
            what: "writing to the client".to_owned(),
            source: Some(source),
        })?;
    drop(stdout);
    let connections = (0..setup.connections)
        .map(|_| listener.accept_timeout(ACCEPT_TIMEOUT))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| KvError::Setup {
            source: Box::new(source),
        })?;
    drop(listener);
    serve(connections, &store, &sampler)?;
    drop(transport);
    returned(&budget)
}

/// Reads stdin to its end on a thread of its own, then ends the process: the client holds
/// the other end, and only closes it by going away.
fn exit_when_stdin_closes() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        eprintln!("kv server: the client process is gone");
        std::process::exit(1);
    });
}
