//! `tierbuf demo --provider shm`: the clients in this process, the servers in a second
//! process of this program (the hidden `tierbuf demo-peer`), each connection pair one pair
//! of shared-memory endpoints.
//!
//! # How the two processes work together
//!
//! - The demo makes a private directory under the temporary directory and starts the peer
//!   with the demo's own flags and `--socket DIR/peer.sock`; the demo removes the
//!   directory once every connection is made, or when it fails before.
//! - The peer listens on the socket and says `listening` on its stdout; the demo then
//!   connects once per connection pair, one after the other, so connection `i` is the
//!   `i`th on both sides.
//! - The peer answers exactly `--messages` requests on each connection. Both then run the
//!   quiet phase: the peer says `quiet` once its registered memory is back where it
//!   started and keeps its connections going until the demo writes `report` to its stdin;
//!   it answers with one line, `report` and its figures as `name=value` fields, closes its
//!   connections and exits. Its errors go to its stderr, which is the demo's.
//! - The peer never outlives the demo: it exits at once when its stdin closes before it is
//!   done (the demo is gone, however it ended), and fails when a connection reports the
//!   demo's process dead; the demo kills it when the demo fails first.
//!
//! # Open files
//!
//! Each process holds a socket per connection and a memory file per registered region, so
//! a few thousand connections pass the usual soft limit of 1024 open files: both processes
//! build their transport for `--connections` connections, which raises the soft limit up
//! to the hard limit when it must, and refuses a connection count that even the hard limit
//! cannot hold.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use tierbuf_examples::Doing;
use tierbuf_examples::process::ChildProcess;
use tierbuf_transport::Transport;

use super::DemoError;
use super::args::DemoArgs;
use super::remote::{ClientLines, PeerLines, remote_clients, remote_servers};
use super::setup::{Setup, Side, check_returned};

/// How long the demo waits for the peer's next line, or for it to exit.
const PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// Flags of the hidden `tierbuf demo-peer`.
#[derive(Debug, Args)]
pub(crate) struct PeerArgs {
    /// The Unix-domain socket to listen on; it must not exist yet.
    #[arg(long)]
    socket: PathBuf,
    /// The flags of the demo this process is the peer of.
    #[command(flatten)]
    demo: DemoArgs,
}

/// The demo's side of a shm run: starts the peer, connects, runs the clients, and reports
/// both processes' figures.
pub(super) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    // Building the transport raises the open-file limit first, for the peer too.
    let (setup, transport) = Setup::build(args, Transport::shm())?;
    let setup = &setup;
    let dir = RunDirectory::create()?;
    let socket = dir.path().join("peer.sock");
    let mut peer = Peer::start(args, &socket)?;
    match peer.next_line()?.as_str() {
        "listening" => {}
        other => return Err(peer.unexpected(other)),
    }

    let budget = transport.budget().clone();
    let mut clients = Side::connect(args.connections, |index| {
        transport
            .connect(&socket)
            .map_err(|e| Doing::new(format!("connection {index} to the peer process"), e).into())
    })?;
    // Every connection has its own socket now: with the directory gone, nothing is left
    // behind even if this process is killed.
    drop(dir);
    let placement = format!(
        "clients in this process (PID {}), servers in the peer process PID {}, over shared memory",
        std::process::id(),
        peer.pid()
    );
    remote_clients(
        args,
        setup,
        &budget,
        transport.reservoir(),
        &mut clients,
        &mut peer,
        placement,
    )?;
    drop((clients, transport));
    peer.finish()?;
    check_returned(&budget)
}

/// Runs the peer process; its errors go to stderr, its lines for the demo to stdout.
pub(crate) fn run_peer(args: PeerArgs) -> ExitCode {
    match peer(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tierbuf demo-peer: {}", super::with_causes(&*error));
            ExitCode::FAILURE
        }
    }
}

/// The peer's side of a shm run: the servers.
fn peer(args: &PeerArgs) -> Result<(), DemoError> {
    let demo = &args.demo;
    let (_, transport) = Setup::build(demo, Transport::shm())?;
    let requests = watch_the_demo();
    let budget = transport.budget().clone();
    let listener = transport.listen(&args.socket)?;
    tell_the_demo("listening")?;
    let mut servers = Side::connect(demo.connections, |index| {
        listener
            .accept()
            .map_err(|e| Doing::new(format!("connection {index} from the demo"), e).into())
    })?;
    drop(listener);
    remote_servers(
        demo.messages,
        &mut servers,
        &budget,
        transport.reservoir(),
        &mut DemoLink { requests },
    )?;
    drop((servers, transport));
    check_returned(&budget)
}

/// The peer's line channel to the demo: requests from stdin (see [`watch_the_demo`]),
/// lines to stdout.
struct DemoLink {
    requests: Receiver<()>,
}

impl ClientLines for DemoLink {
    fn report_asked(&mut self) -> Result<bool, DemoError> {
        match self.requests.try_recv() {
            Ok(()) => Ok(true),
            Err(TryRecvError::Empty) => Ok(false),
            Err(TryRecvError::Disconnected) => Err("the stdin reader stopped".into()),
        }
    }

    fn tell(&mut self, line: &str) -> Result<(), DemoError> {
        tell_the_demo(line)
    }
}

/// Reads the demo's requests from stdin on a thread of its own; each `report` line is one
/// message on the returned channel. When stdin closes, the demo is gone, and this process
/// exits at once.
fn watch_the_demo() -> Receiver<()> {
    let (sender, requests) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            match line {
                Ok(line) if line == "report" => {
                    if sender.send(()).is_err() {
                        return;
                    }
                }
                Ok(other) => {
                    eprintln!("tierbuf demo-peer: unexpected request {other:?}");
                    std::process::exit(1);
                }
                Err(_) => break,
            }
        }
        eprintln!("tierbuf demo-peer: the demo process is gone");
        std::process::exit(1);
    });
    requests
}

/// Writes one line for the demo on stdout.
fn tell_the_demo(line: &str) -> Result<(), DemoError> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing to the demo process: {e}").into())
}

/// The peer process, as the demo sees it: its stdin for requests, its stdout's lines.
/// Dropping it kills the process if it still runs ([`ChildProcess`]).
#[derive(Debug)]
struct Peer {
    process: ChildProcess,
}

impl Peer {
    /// Starts `tierbuf demo-peer` with the demo's flags, to listen at `socket`.
    fn start(args: &DemoArgs, socket: &Path) -> Result<Peer, DemoError> {
        let program = std::env::current_exe()
            .map_err(|e| format!("finding this program to start the peer process: {e}"))?;
        let mut command = Command::new(program);
        command
            .arg("demo-peer")
            .arg("--socket")
            .arg(socket)
            .args(args.flags());
        let process = ChildProcess::start(command)
            .map_err(|e| format!("the peer process: {}", super::with_causes(&e)))?;
        Ok(Peer { process })
    }

    fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Waits up to [`PEER_TIMEOUT`] for the peer to exit, and fails unless it succeeded.
    fn finish(&mut self) -> Result<(), DemoError> {
        self.process
            .finish(PEER_TIMEOUT)
            .map_err(|e| format!("the peer process: {}", super::with_causes(&e)).into())
    }
}

impl PeerLines for Peer {
    const PATIENCE: Duration = PEER_TIMEOUT;

    fn lines(&self) -> &Receiver<String> {
        self.process.lines()
    }

    fn silent(&self) -> DemoError {
        format!(
            "the peer process (PID {}) said nothing for {PEER_TIMEOUT:?}",
            self.pid()
        )
        .into()
    }

    /// Its exit status, once it has stopped writing.
    fn gone(&mut self) -> DemoError {
        match self.process.exit_status(PEER_TIMEOUT) {
            Ok(status) => format!(
                "the peer process (PID {}) ended early ({status}); its error, if any, is above",
                self.pid()
            )
            .into(),
            Err(error) => format!("the peer process: {}", super::with_causes(&error)).into(),
        }
    }

    fn unexpected(&self, line: &str) -> DemoError {
        format!("unexpected line from the peer process: {line:?}").into()
    }

    fn ask_for_report(&mut self) -> Result<(), DemoError> {
        self.process.write_line("report").map_err(|e| {
            format!(
                "asking the peer process for its report: {}",
                super::with_causes(&e)
            )
            .into()
        })
    }
}

/// A directory of this run's own under the temporary directory, removed when dropped.
#[derive(Debug)]
struct RunDirectory {
    path: PathBuf,
}

impl RunDirectory {
    fn create() -> Result<RunDirectory, DemoError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("tierbuf-demo-{}-{nanos:09}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        Ok(RunDirectory { path })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDirectory {
    fn drop(&mut self) {
        // Only a stale directory in the temporary directory is left if this fails.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
