//! The `rpc` example (a tarpc service over tierbuf) as a user runs it, small: over shm
//! with the server a real second process, and over loopback; a reply changed by the
//! server, or the server exiting mid-run, fails the client with a message and a non-zero
//! exit status. Each process is back at its starting registered memory after the idle
//! phase, and no run leaves its socket file behind, a server that exited mid-run
//! included.
//!
//! Runs the example's binary, which `cargo test` builds beside the tests
//! (`target/<profile>/examples/rpc`).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The example's binary, from this test's own path (`target/<profile>/deps/rpc-…`).
fn example() -> PathBuf {
    let test = std::env::current_exe().expect("this test's path");
    let profile = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let example = profile.join("examples").join("rpc");
    assert!(
        example.exists(),
        "{} is missing: `cargo test -p tierbuf-examples` (without target filters) or `cargo build -p tierbuf-examples --example rpc` builds it",
        example.display()
    );
    example
}

fn rpc(args: &[&str]) -> (Output, String, String) {
    let small = ["--connections", "4", "--calls", "40", "--large-every", "8"];
    let small = ["--max-large-kib", "256", "--demote-after", "20ms"]
        .iter()
        .chain(&small);
    let client = Command::new(example())
        .args(small.chain(args))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the example");
    // The shm server listens at a path named for the client's process.
    let socket = std::env::temp_dir().join(format!("tierbuf-rpc-{}.sock", client.id()));
    let output = client.wait_with_output().expect("the example's output");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !socket.exists(),
        "{} was left behind\n{stdout}\n{stderr}",
        socket.display()
    );
    (output, stdout, stderr)
}

fn a_small_run_checks_every_reply_and_reports(provider: &str, heading: &str) {
    let (output, stdout, stderr) = rpc(&["--provider", provider]);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for line in [
        heading,
        "160 calls, every reply checked",
        "calls/s",
        "< 64 KiB",
        "256 KiB",
        "registered at peak",
        "registered after idle",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    assert!(!stdout.contains("requests: 0 promotions"), "{stdout}");
    let (start, after_idle) = (
        mib(&stdout, "registered at start"),
        mib(&stdout, "registered after idle"),
    );
    assert!(
        after_idle <= start,
        "both processes hold more after the idle phase than at start:\n{stdout}"
    );
}

/// The MiB figure of the report's line that begins with `label`.
fn mib(report: &str, label: &str) -> f64 {
    let line = report
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in\n{report}"));
    let figure = line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .next();
    figure
        .and_then(|figure| figure.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {line:?}"))
}

#[test]
fn over_shm_with_the_server_in_a_second_process() {
    a_small_run_checks_every_reply_and_reports("shm", "shm, server in a second process");
}

#[test]
fn over_loopback_in_one_process() {
    a_small_run_checks_every_reply_and_reports("loopback", "loopback, one process");
}

#[test]
fn a_changed_reply_fails_the_client() {
    let (output, stdout, stderr) = rpc(&["--fault", "corrupt"]);
    assert!(!output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("differs from the request"), "{stderr}");
}

#[test]
fn the_server_exiting_mid_run_fails_the_client() {
    let (output, stdout, stderr) = rpc(&["--fault", "exit"]);
    assert!(!output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("rpc: call "), "{stderr}");
}
