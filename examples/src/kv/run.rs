//! A whole run of the workload: over shm with the server in a second process
//! ([`over_shm`]), or over loopback with the server on threads of this one
//! ([`over_loopback`]).

use std::path::Path;
use std::process::Command;

use tierbuf_transport::{SetupError, Transport};

use super::client::{Outcome, Workload, run_workload};
use super::memory::Sampler;
use super::process::{ServerProcess, socket_path};
use super::server::{SAMPLE_PERIOD, serve};
use super::store::Store;
use super::{KvError, Setup, returned};

/// Runs `workload` over shm: starts the server process with `server(socket)` (the command,
/// or why there is none,
/// that ends in [`run_shm_server`](super::server::run_shm_server) at `socket` with the
/// same `setup`), connects `setup.connections` times, runs the workload, hangs up, and
/// checks that the server exits successfully and that every byte registered here came
/// back. The memory in the outcome is both processes' added.
///
/// # Errors
///
/// The first failure, of either side.
pub fn over_shm(
    setup: &Setup,
    workload: &Workload,
    server: impl FnOnce(&Path) -> Result<Command, KvError>,
) -> Result<Outcome, KvError> {
    let transport = setup.transport(Transport::shm())?;
    let budget = transport.budget().clone();
    let socket = socket_path();
    let process = ServerProcess::start(server(&socket)?, socket.clone())?;
    let connections = (0..setup.connections)
        .map(|_| transport.connect(&socket))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| KvError::Setup {
            source: Box::new(source),
        })?;
    let outcome = run_workload(connections, workload, Some(budget.clone()))?;
    process.finish()?;
    drop(transport);
    returned(&budget).map(|()| outcome)
}

/// Runs `workload` over loopback, the server on threads of this process sharing its
/// transport (so one budget holds both sides' memory), and checks that every registered
/// byte came back.
///
/// # Errors
///
/// The first failure, of either side.
pub fn over_loopback(setup: &Setup, workload: &Workload) -> Result<Outcome, KvError> {
    let transport = setup.transport(Transport::loopback())?;
    let budget = transport.budget().clone();
    let setup_error = |source: SetupError| KvError::Setup {
        source: Box::new(source),
    };
    let listener = transport.listen("kv").map_err(setup_error)?;
    let mut clients = Vec::with_capacity(setup.connections);
    let mut servers = Vec::with_capacity(setup.connections);
    for _ in 0..setup.connections {
        clients.push(transport.connect("kv").map_err(setup_error)?);
        servers.push(listener.accept().map_err(setup_error)?);
    }
    drop(listener);
    let store = Store::create_temporary().map_err(|source| KvError::Store { source })?;
    let sampler = Sampler::start(budget.clone(), SAMPLE_PERIOD);
    let outcome = std::thread::scope(|scope| {
        let server = scope.spawn(|| serve(servers, &store, &sampler));
        // However the workload ends, its connections close, and the server's threads end.
        let outcome = run_workload(clients, workload, None);
        let served = server.join().map_err(|_| KvError::Panicked("server"))?;
        let outcome = outcome?;
        served.map(|()| outcome)
    })?;
    drop(transport);
    returned(&budget).map(|()| outcome)
}
