//! The server process, as the client sees it: started from a command the caller prepares
//! (the `kv` example runs itself again, the integration test its own test binary), ready
//! once it has written [`LISTENING`] on its stdout, ended when dropped
//! ([`ChildProcess`]).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::KvError;
use super::server::LISTENING;
use crate::process::ChildProcess;

/// How long the client waits for the server process to listen, and to exit.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// A socket path of this process's own under the temporary directory, which does not
/// exist yet.
pub fn socket_path() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    std::env::temp_dir().join(format!("tierbuf-kv-{}-{nanos:09}.sock", std::process::id()))
}

/// A running server process. Its stdin stays open until it is dropped: the server exits
/// when it closes.
#[derive(Debug)]
pub struct ServerProcess {
    child: ChildProcess,
}

impl ServerProcess {
    /// Starts `command`, the server to listen at `socket`, and waits up to
    /// [`PROCESS_TIMEOUT`] for its [`LISTENING`] line (other lines before it, a test
    /// harness's say, are passed over). The socket's file is removed once the process is
    /// gone.
    ///
    /// # Errors
    ///
    /// [`KvError::ServerProcess`] when it cannot start, ends before listening, or does
    /// not listen in time.
    pub fn start(command: Command, socket: PathBuf) -> Result<ServerProcess, KvError> {
        let mut child = ChildProcess::start(command).map_err(server_process)?;
        child.remove_on_drop(socket);
        child
            .wait_for_line(LISTENING, PROCESS_TIMEOUT)
            .map_err(server_process)?;
        Ok(ServerProcess { child })
    }

    /// Waits up to [`PROCESS_TIMEOUT`] for the process to exit, and fails unless it
    /// succeeded.
    ///
    /// # Errors
    ///
    /// [`KvError::ServerProcess`].
    pub fn finish(mut self) -> Result<(), KvError> {
        self.child.finish(PROCESS_TIMEOUT).map_err(server_process)
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        self.child.kill();
    }
}

fn server_process(source: crate::process::ProcessError) -> KvError {
    KvError::ServerProcess { source }
}
