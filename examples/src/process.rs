//! A second process of a two-process run, as the process that started it sees it: the
//! `kv` and `rpc` examples' server processes and the demo's shm peer.
//!
//! # Invariants
//!
//! - **Never outlived.** A [`ChildProcess`] dropped while its process runs closes the
//!   process's stdin (a process of these examples exits when it closes), kills it and
//!   waits for it, and removes the file it was told to ([`ChildProcess::remove_on_drop`]):
//!   a socket file the process listened at, which a killed process leaves behind.
//! - **Never blocked on its output.** The process's stdout is read line by line on a
//!   thread of its own into an unbounded channel ([`read_lines`]) for as long as the
//!   [`ChildProcess`] lives, so the process never blocks on a full pipe.
//! - **Every wait has a limit.** Waiting for a line or for the exit takes a patience and
//!   fails with [`ProcessError::Silent`] or [`ProcessError::DidNotExit`] past it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// What went wrong with a [`ChildProcess`]; every variant but [`ProcessError::Start`]
/// names the process's id.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The process could not be started (this side's fault, or the system's).
    #[error("starting {program}")]
    Start {
        /// The program that was to run.
        program: String,
        /// Why it could not.
        #[source]
        source: std::io::Error,
    },
    /// The process wrote nothing for the patience given (the process's fault).
    #[error("PID {pid}: it said nothing for {waited:?}")]
    Silent {
        /// The process.
        pid: u32,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The process's stdout ended before the line waited for (the process's fault); it
    /// exited with `status` if it did within a second of that.
    #[error("PID {pid}: it ended ({}); its error, if any, is above", status.map_or("still running".to_owned(), |status| status.to_string()))]
    Ended {
        /// The process.
        pid: u32,
        /// How it exited.
        status: Option<ExitStatus>,
    },
    /// The process exited unsuccessfully (the process's fault).
    #[error("PID {pid}: it failed ({status}); its error, if any, is above")]
    Failed {
        /// The process.
        pid: u32,
        /// How it exited.
        status: ExitStatus,
    },
    /// The process did not exit within the patience given (the process's fault).
    #[error("PID {pid}: it did not exit within {waited:?}")]
    DidNotExit {
        /// The process.
        pid: u32,
        /// How long it was waited for.
        waited: Duration,
    },
    /// Writing to the process's stdin, or asking the system about it, failed.
    #[error("PID {pid}: {what}")]
    Io {
        /// The process.
        pid: u32,
        /// What this side was doing.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// Reads `reader` line by line on a thread of its own, until it ends or fails or the
/// returned channel is dropped.
pub fn read_lines(reader: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A process started with its stdin and stdout piped (module invariants).
///
/// ```
/// use std::process::Command;
/// use std::time::Duration;
/// use tierbuf_examples::process::ChildProcess;
///
/// let mut command = Command::new("sh");
/// command.args(["-c", "echo starting; echo listening here; read line; echo got $line"]);
/// let mut child = ChildProcess::start(command)?;
/// let address = child.wait_for_line("listening ", Duration::from_secs(10))?;
/// assert_eq!(address, "here");
/// child.write_line("report")?;
/// assert_eq!(child.next_line(Duration::from_secs(10))?, "got report");
/// child.finish(Duration::from_secs(10))?;
/// # Ok::<(), tierbuf_examples::process::ProcessError>(())
/// ```
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    remove_on_drop: Option<PathBuf>,
}

impl ChildProcess {
    /// Starts `command` with its stdin and stdout piped (its stderr is this process's).
    ///
    /// # Errors
    ///
    /// [`ProcessError::Start`].
    pub fn start(mut command: Command) -> Result<ChildProcess, ProcessError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|source| ProcessError::Start {
                program: command.get_program().to_string_lossy().into_owned(),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        Ok(ChildProcess {
            child,
            stdin,
            lines: read_lines(stdout),
            remove_on_drop: None,
        })
    }

    /// The process's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process's stdout, line by line, for a caller that waits on it its own way.
    pub fn lines(&self) -> &Receiver<String> {
        &self.lines
    }

    /// Has `path` removed when this is dropped (module invariants).
    pub fn remove_on_drop(&mut self, path: PathBuf) {
        self.remove_on_drop = Some(path);
    }

    /// The next line the process writes, waiting up to `patience` for it.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Silent`] past `patience`; [`ProcessError::Ended`] once its stdout
    /// has ended.
    pub fn next_line(&mut self, patience: Duration) -> Result<String, ProcessError> {
        match self.lines.recv_timeout(patience) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => Err(ProcessError::Silent {
                pid: self.id(),
                waited: patience,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(self.ended()),
        }
    }

    /// The rest of the first line that starts with `prefix`, passing over other lines (a
    /// test harness's, say); `patience` is for the whole wait.
    ///
    /// # Errors
    ///
    /// As [`ChildProcess::next_line`].
    pub fn wait_for_line(
        &mut self,
        prefix: &str,
        patience: Duration,
    ) -> Result<String, ProcessError> {
        let deadline = Instant::now() + patience;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.next_line(left).map_err(|error| match error {
                ProcessError::Silent { pid, .. } => ProcessError::Silent {
                    pid,
                    waited: patience,
                },
                other => other,
            })?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest.to_owned());
            }
        }
    }

    /// Writes `line` and a newline to the process's stdin.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Io`].
    pub fn write_line(&mut self, line: &str) -> Result<(), ProcessError> {
        let pid = self.id();
        let stdin = self.stdin.as_mut().expect("stdin is piped until dropped");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|source| ProcessError::Io {
                pid,
                what: "writing to its stdin",
                source,
            })
    }

    /// Waits up to `patience` for the process to exit, and fails unless it succeeded.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Failed`], [`ProcessError::DidNotExit`] or [`ProcessError::Io`].
    pub fn finish(&mut self, patience: Duration) -> Result<(), ProcessError> {
        let status = self.exit_status(patience)?;
        if status.success() {
            Ok(())
        } else {
            Err(ProcessError::Failed {
                pid: self.id(),
                status,
            })
        }
    }

    /// Waits up to `patience` for the process to exit.
    ///
    /// # Errors
    ///
    /// [`ProcessError::DidNotExit`] or [`ProcessError::Io`].
    pub fn exit_status(&mut self, patience: Duration) -> Result<ExitStatus, ProcessError> {
        let deadline = Instant::now() + patience;
        loop {
            let exited = self.child.try_wait().map_err(|source| ProcessError::Io {
                pid: self.child.id(),
                what: "waiting for it",
                source,
            })?;
            if let Some(status) = exited {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::DidNotExit {
                    pid: self.id(),
                    waited: patience,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process, if it still runs, and waits for it.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // Either it is killed, or it exited meanwhile; `wait` reaps it either way.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The error for a stdout that ended: the process's exit status, if it exits soon.
    fn ended(&mut self) -> ProcessError {
        ProcessError::Ended {
            pid: self.id(),
            status: self.exit_status(Duration::from_secs(1)).ok(),
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        self.kill();
        if let Some(path) = &self.remove_on_drop {
            // Only a stale file in the temporary directory is left if this fails.
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> ChildProcess {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        ChildProcess::start(command).expect("sh starts")
    }

    #[test]
    fn a_silent_process_is_reported_and_killed_when_dropped() {
        let mut child = shell("exec sleep 30");
        let error = child.next_line(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(error, ProcessError::Silent { .. }), "{error}");
        let pid = child.id();
        drop(child);
        // Killed and reaped: no process of that id is left (a zombie would still show).
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn a_process_that_ends_before_its_line_reports_its_status() {
        let mut child = shell("echo other; exit 3");
        let error = child
            .wait_for_line("listening ", Duration::from_secs(10))
            .unwrap_err();
        match error {
            ProcessError::Ended {
                status: Some(status),
                ..
            } => assert_eq!(status.code(), Some(3)),
            other => panic!("{other}"),
        }
        let error = child.finish(Duration::from_secs(10)).unwrap_err();
        assert!(matches!(error, ProcessError::Failed { .. }), "{error}");
    }

    #[test]
    fn a_process_that_does_not_exit_is_reported() {
        let mut child = shell("echo up; exec sleep 30");
        assert_eq!(child.next_line(Duration::from_secs(10)).unwrap(), "up");
        let error = child.finish(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(error, ProcessError::DidNotExit { .. }), "{error}");
    }

    #[test]
    fn dropping_it_ends_the_process_and_removes_its_file() {
        let path = std::env::temp_dir().join(format!("tierbuf-process-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let mut child = shell("read line; echo never");
        child.remove_on_drop(path.clone());
        drop(child);
        assert!(!path.exists());
    }
}
