//! `tierbuf demo --provider verbs`: the connection pairs between two machines (or two
//! processes) with RDMA devices. The side given `--listen ADDR` runs the servers, as the
//! shm peer process does; the side given `--peer ADDR` runs the clients and prints the
//! report, with both sides' figures.
//!
//! # How the two sides work together
//!
//! - Both sides are given the same demo flags. Each opens its device, checks that
//!   `RLIMIT_MEMLOCK` lets the connections pin what they may need, and fills its
//!   reservoir.
//! - The listening side takes one control connection (TCP) at ADDR. The client sends its
//!   plan there, `plan CONNECTIONS MESSAGES LADDER`; the listening side compares it with
//!   its own and answers `refused REASON`, or `listening PORT` once it listens for the
//!   RDMA connections on PORT, at the address the control connection reached.
//! - The client connects once per connection pair, one after the other, so connection `i`
//!   is the `i`th on both sides.
//! - Then as over shm: the listening side answers exactly `--messages` requests on each
//!   connection, says `quiet` once its registered memory is back where it started, and
//!   keeps its connections going until the client sends `report`; it answers with one
//!   line, `report` and its figures as `name=value` fields.
//! - The client closes its connections and sends `closed`; the listening side closes its
//!   own, answers `done` once every byte it registered came back (`failed REASON`
//!   otherwise), and exits. Either side fails when the control connection ends early.

use std::io::Write;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use tierbuf_examples::Doing;
use tierbuf_examples::process::read_lines;
use tierbuf_transport::verbs::VerbsConfig;
use tierbuf_transport::{Transport, Verbs};

use super::DemoError;
use super::args::DemoArgs;
use super::remote::{ClientLines, PeerLines, remote_clients, remote_servers};
use super::setup::{Setup, Side, check_returned};

/// How long one side waits for the other's next line on the control connection.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the side that `--listen` or `--peer` names.
pub(super) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    // clap requires --device and one of --listen and --peer with --provider verbs.
    let device = args
        .device
        .as_deref()
        .ok_or("--provider verbs needs --device")?;
    match (&args.listen, &args.peer) {
        (Some(addr), None) => listening_side(args, device, addr),
        (None, Some(addr)) => client_side(args, device, addr),
        _ => Err("--provider verbs needs one of --listen and --peer".into()),
    }
}

/// Opens `device` for the run's transport, which checks that RLIMIT_MEMLOCK lets the
/// connections pin what they may need and that the open-file limit holds them, and fills
/// the reservoir.
fn open(args: &DemoArgs, device: &str) -> Result<(Setup, Transport<Verbs>), DemoError> {
    let mut config = VerbsConfig::new(device);
    if let Some(port) = args.ib_port {
        config = config.with_port(port);
    }
    if let Some(gid_index) = args.gid_index {
        config = config.with_gid_index(gid_index);
    }
    Setup::build(args, Transport::verbs(config))
        .map_err(|e| format!("RDMA device {device:?}: {}", super::with_causes(&*e)).into())
}

/// The plan the client sends: what the two sides must agree on.
fn plan(args: &DemoArgs, setup: &Setup) -> String {
    format!(
        "plan {} {} {:?}",
        args.connections,
        args.messages,
        setup.ladder.to_toml_string()
    )
}

/// Checks the client's plan line against this side's; otherwise, why they differ.
fn check_plan(theirs: &str, ours: &str) -> Result<(), String> {
    if theirs == ours {
        return Ok(());
    }
    let theirs_fields: Vec<&str> = theirs.splitn(4, ' ').collect();
    let ours_fields: Vec<&str> = ours.splitn(4, ' ').collect();
    if theirs_fields.len() != 4 || theirs_fields[0] != "plan" {
        return Err(format!("the client's plan is malformed: {theirs:?}"));
    }
    for (index, flag) in [(1, "--connections"), (2, "--messages")] {
        if theirs_fields[index] != ours_fields[index] {
            return Err(format!(
                "the client runs with {flag} {}, the listening side with {flag} {}: give \
                 both sides the same demo flags",
                theirs_fields[index], ours_fields[index]
            ));
        }
    }
    Err(
        "the two sides' ladders differ: give both sides the same --preset or ladder file, \
         --demote-after and --hysteresis"
            .into(),
    )
}

/// The side given `--listen`: the servers.
fn listening_side(args: &DemoArgs, device: &str, addr: &str) -> Result<(), DemoError> {
    let (setup, transport) = open(args, device)?;
    let setup = &setup;
    let budget = transport.budget().clone();
    let control_listener =
        TcpListener::bind(addr).map_err(|e| format!("listening at {addr}: {e}"))?;
    let local_addr = control_listener.local_addr()?;
    println!(
        "tierbuf demo: {} connection pairs on RDMA device {}, listening at {local_addr} for \
         `tierbuf demo --provider verbs --peer`; RDMA path: {}",
        args.connections,
        transport.provider().device_name(),
        transport.provider().path()
    );
    std::io::stdout().flush()?;
    let (stream, client) = control_listener
        .accept()
        .map_err(|e| format!("accepting the client's control connection at {addr}: {e}"))?;
    drop(control_listener);
    let mut control = Control::new(stream, "the client side")?;
    let line = control.next_line()?;
    if let Err(reason) = check_plan(&line, &plan(args, setup)) {
        control.send(&format!("refused {reason}"))?;
        return Err(format!("refused the client at {client}: {reason}").into());
    }

    let listener = transport.listen((control.local_ip()?, 0))?;
    let port = listener.address().parse::<SocketAddr>()?.port();
    control.send(&format!("listening {port}"))?;
    let mut servers = Side::connect(args.connections, |index| {
        listener.accept().map_err(|e| {
            Doing::new(format!("connection {index} from the client at {client}"), e).into()
        })
    })?;
    drop(listener);
    remote_servers(
        args.messages,
        &mut servers,
        &budget,
        transport.reservoir(),
        &mut control,
    )?;
    match control.next_line()?.as_str() {
        "closed" => {}
        other => return Err(control.unexpected(other)),
    }
    drop((servers, transport));
    let returned = check_returned(&budget);
    match &returned {
        Ok(()) => control.send("done")?,
        Err(error) => control.send(&format!("failed {}", super::with_causes(&**error)))?,
    }
    returned?;
    println!(
        "tierbuf demo: served {} connection pairs for {client}, which printed the report",
        args.connections
    );
    Ok(())
}

/// The side given `--peer`: the clients, and the report.
fn client_side(args: &DemoArgs, device: &str, addr: &str) -> Result<(), DemoError> {
    let (setup, transport) = open(args, device)?;
    let setup = &setup;
    let budget = transport.budget().clone();
    let peer = addr
        .to_socket_addrs()
        .map_err(|e| format!("--peer {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("--peer {addr} names no address"))?;
    let stream = TcpStream::connect_timeout(&peer, CONTROL_TIMEOUT).map_err(|e| {
        format!(
            "connecting to the listening side at {peer}: {e} (is `tierbuf demo --provider \
             verbs --listen` running there?)"
        )
    })?;
    let mut control = Control::new(stream, "the listening side")?;
    control.send(&plan(args, setup))?;
    let line = control.next_line()?;
    let port: u16 = if let Some(port) = line.strip_prefix("listening ") {
        port.parse().map_err(|_| control.unexpected(&line))?
    } else if let Some(reason) = line.strip_prefix("refused ") {
        return Err(format!("the listening side refused the run: {reason}").into());
    } else {
        return Err(control.unexpected(&line));
    };

    let rdma_addr = SocketAddr::new(peer.ip(), port);
    let mut clients = Side::connect(args.connections, |index| {
        transport.connect(rdma_addr).map_err(|e| {
            Doing::new(
                format!("connection {index} to the listening side at {rdma_addr}"),
                e,
            )
            .into()
        })
    })?;
    // Two header lines: where each side ran, then the path this side's queue pairs took.
    let placement = format!(
        "clients in this process (PID {}) on RDMA device {}, servers in the peer process at {peer}, over verbs\n  \
         RDMA path: {}",
        std::process::id(),
        transport.provider().device_name(),
        transport.provider().path()
    );
    remote_clients(
        args,
        setup,
        &budget,
        transport.reservoir(),
        &mut clients,
        &mut control,
        placement,
    )?;
    drop((clients, transport));
    control.send("closed")?;
    let line = control.next_line()?;
    if let Some(reason) = line.strip_prefix("failed ") {
        return Err(format!("the listening side failed: {reason}").into());
    }
    if line != "done" {
        return Err(control.unexpected(&line));
    }
    check_returned(&budget)
}

/// The control connection between the two sides: lines of text both ways, those coming in
/// read on a thread of their own. Dropping it shuts the connection down.
#[derive(Debug)]
struct Control {
    stream: TcpStream,
    lines: Receiver<String>,
    /// The other side, as errors name it.
    other: &'static str,
}

impl Control {
    fn new(stream: TcpStream, other: &'static str) -> Result<Control, DemoError> {
        let reader = stream
            .try_clone()
            .map_err(|e| format!("the control connection to {other}: {e}"))?;
        Ok(Control {
            stream,
            lines: read_lines(reader),
            other,
        })
    }

    /// The address of this side of the connection.
    fn local_ip(&self) -> Result<IpAddr, DemoError> {
        Ok(self.stream.local_addr()?.ip())
    }

    /// Writes one line.
    fn send(&mut self, line: &str) -> Result<(), DemoError> {
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("writing to {}: {e}", self.other).into())
    }
}

impl PeerLines for Control {
    const PATIENCE: Duration = CONTROL_TIMEOUT;

    fn lines(&self) -> &Receiver<String> {
        &self.lines
    }

    fn silent(&self) -> DemoError {
        format!("{} said nothing for {CONTROL_TIMEOUT:?}", self.other).into()
    }

    /// The other side ended the connection.
    fn gone(&mut self) -> DemoError {
        format!(
            "{} closed the control connection early; its error, if any, is on its stderr",
            self.other
        )
        .into()
    }

    fn unexpected(&self, line: &str) -> DemoError {
        format!("unexpected line from {}: {line:?}", self.other).into()
    }

    fn ask_for_report(&mut self) -> Result<(), DemoError> {
        self.send("report")
    }
}

impl ClientLines for Control {
    fn report_asked(&mut self) -> Result<bool, DemoError> {
        match self.try_line()? {
            None => Ok(false),
            Some(line) if line == "report" => Ok(true),
            Some(other) => Err(self.unexpected(&other)),
        }
    }

    fn tell(&mut self, line: &str) -> Result<(), DemoError> {
        self.send(line)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        // Ends the reading thread's clone too; the socket may be gone already.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_plans_agree() {
        let plan = "plan 16 30 \"[policy]\\ndemote_after = \\\"300ms\\\"\\n\"";
        assert_eq!(check_plan(plan, plan), Ok(()));
    }

    #[test]
    fn a_differing_plan_names_the_flag() {
        let ours = "plan 16 30 \"ladder\"";
        let error = check_plan("plan 8 30 \"ladder\"", ours).unwrap_err();
        assert!(
            error.contains("--connections 8") && error.contains("--connections 16"),
            "{error}"
        );
        let error = check_plan("plan 16 5 \"ladder\"", ours).unwrap_err();
        assert!(error.contains("--messages 5"), "{error}");
        let error = check_plan("plan 16 30 \"other\"", ours).unwrap_err();
        assert!(error.contains("ladders differ"), "{error}");
        let error = check_plan("hello", ours).unwrap_err();
        assert!(error.contains("malformed"), "{error}");
    }
}
