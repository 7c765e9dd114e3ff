//! The server process, as the client sees it: started from a command the caller prepares
//! (the `kv` example runs itself again, the integration test its own test binary), ready
//! once it has written [`LISTENING`] on its stdout, killed if dropped while it runs.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::KvError;
use super::server::LISTENING;

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
    child: Child,
    stdin: Option<ChildStdin>,
}

impl ServerProcess {
    /// Starts `command` with its stdin and stdout piped, and waits for its [`LISTENING`]
    /// line (other lines before it, a test harness's say, are passed over).
    ///
    /// # Errors
    ///
    /// [`KvError::Process`] when it cannot start, ends before listening, or does not
    /// listen within [`PROCESS_TIMEOUT`].
    pub fn start(mut command: Command) -> Result<ServerProcess, KvError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|source| KvError::Process {
                what: "starting it".to_owned(),
                source: Some(source),
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let process = ServerProcess { child, stdin };
        let (sender, listening) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let found = lines.by_ref().find(|line| match line {
                Ok(line) => line == LISTENING,
                Err(_) => true,
            });
            // The receiver is gone only if the client stopped waiting.
            let _ = sender.send(found.transpose());
            // The rest is read and dropped, so the process never blocks on a full pipe
            // nor fails writing to a closed one.
            lines.for_each(drop);
        });
        match listening.recv_timeout(PROCESS_TIMEOUT) {
            Ok(Ok(Some(_))) => Ok(process),
            Ok(Ok(None)) | Err(RecvTimeoutError::Disconnected) => {
                Err(process.failed("it ended before listening"))
            }
            Ok(Err(source)) => Err(KvError::Process {
                what: "reading its stdout".to_owned(),
                source: Some(source),
            }),
            Err(RecvTimeoutError::Timeout) => {
                Err(process.failed(&format!("it did not listen within {PROCESS_TIMEOUT:?}")))
            }
        }
    }

    /// The process's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to [`PROCESS_TIMEOUT`] for the process to exit, and fails unless it
    /// succeeded.
    ///
    /// # Errors
    ///
    /// [`KvError::Process`].
    pub fn finish(mut self) -> Result<(), KvError> {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(self.failed(&format!("it failed ({status}); its error is above")));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    return Err(self.failed(&format!("it did not exit within {PROCESS_TIMEOUT:?}")));
                }
                Err(source) => {
                    return Err(KvError::Process {
                        what: format!("waiting for PID {}", self.id()),
                        source: Some(source),
                    });
                }
            }
        }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        // Either it is killed, or it had already exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A [`KvError::Process`] saying `what` of this process.
    fn failed(&self, what: &str) -> KvError {
        KvError::Process {
            what: format!("PID {}: {what}", self.id()),
            source: None,
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}
