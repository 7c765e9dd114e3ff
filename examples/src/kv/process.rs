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
    /// Starts `command` with its stdin and stdout piped, and waits for it to say it
    /// listens.
    ///
    /// # Errors
    ///
    /// [`KvError::Process`] when it cannot start, says anything else first, ends, or says
    /// nothing for [`PROCESS_TIMEOUT`].
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
        let (sender, line) = mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            let read = BufReader::new(stdout).read_line(&mut first);
            // The receiver is gone only if the client stopped waiting.
            let _ = sender.send(read.map(|_| first));
        });
        match line.recv_timeout(PROCESS_TIMEOUT) {
            Ok(Ok(line)) if line.trim_end() == LISTENING => Ok(process),
            Ok(Ok(line)) if line.is_empty() => Err(process.failed("it ended before listening")),
            Ok(Ok(line)) => Err(process.failed(&format!("it said {line:?}, not {LISTENING:?}"))),
            Ok(Err(source)) => Err(KvError::Process {
                what: "reading its stdout".to_owned(),
                source: Some(source),
            }),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
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
