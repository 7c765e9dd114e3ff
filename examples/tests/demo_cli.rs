//! `tierbuf demo` as a user runs it: a small run succeeds and reports tier changes and
//! the peak they made, on loopback and across two processes over shm, and the shm peer
//! process never outlives the demo; bad flags, bad ladder files and too low an open-file
//! limit fail with a clear message and a non-zero exit.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tierbuf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tierbuf"))
        .args(args)
        .output()
        .expect("run tierbuf")
}

/// Runs `tierbuf demo` with `args`, checks that it succeeds and prints every one of
/// `lines`, and returns what it printed.
fn demo_reporting(args: &[&str], lines: &[&str]) -> String {
    let output = tierbuf(&[&["demo"], args].concat());
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in lines {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    stdout
}

#[test]
fn a_small_demo_runs_promotes_demotes_and_reports() {
    let stdout = demo_reporting(
        &[
            "--connections",
            "16",
            "--messages",
            "30",
            "--large-every",
            "3",
        ],
        &[
            "16 connection pairs on loopback, ladder preset two-tier",
            "static top tier up front (from the ladder)",
            "tiered, peak during traffic (measured)",
            "small (tier 0)",
        ],
    );
    assert!(number_after(&stdout, "promotions ") > 0, "{stdout}");
    assert!(number_after(&stdout, "demotions ") > 0, "{stdout}");
    assert!(
        stdout.contains("after the quiet phase: 0 send directions"),
        "every connection steps back down:\n{stdout}"
    );
}

/// The demo registers no spare up front, so a promotion registers a tier, and a peak no
/// higher than the start is a peak that missed it. A run this short read the peak so, in
/// two of six runs, when the peak was a reading of the registered bytes every 64 rounds
/// of each side's loop.
#[test]
fn a_short_demo_reports_the_peak_its_promotions_made() {
    let stdout = demo_reporting(
        &[
            "--connections",
            "64",
            "--messages",
            "2",
            "--large-every",
            "1",
        ],
        &["tiered, peak during traffic (measured)"],
    );
    assert!(number_after(&stdout, "promotions ") > 0, "{stdout}");
    assert!(
        per_endpoint(&stdout, "tiered, peak during traffic (measured)")
            > per_endpoint(&stdout, "tiered, at start (measured)"),
        "{stdout}"
    );
}

/// The bytes per endpoint of the memory line labelled `label` in `text`.
fn per_endpoint(text: &str, label: &str) -> u64 {
    let (_, rest) = text
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in\n{text}"));
    number_after(rest.trim_start(), "")
}

/// The number after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> u64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in\n{text}"))
        + prefix.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {prefix:?} in\n{text}"))
}

/// Whether process `pid` is gone: no such process, or one that has exited and awaits its
/// reaper, or another program that has since been given the id.
fn process_gone(pid: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    state == Some(Some('Z')) || !String::from_utf8_lossy(&cmdline).contains("demo-peer")
}

#[test]
fn a_small_shm_demo_runs_in_two_processes_and_reports() {
    let stdout = demo_reporting(
        &[
            "--provider",
            "shm",
            "--connections",
            "8",
            "--messages",
            "30",
            "--large-every",
            "3",
        ],
        &[
            "8 connection pairs on shm, ladder preset two-tier",
            "(16 endpoints, 8 in each process)",
            "this process   peer process",
            "tiered, peak during traffic (measured)",
        ],
    );
    assert!(number_after(&stdout, "promotions ") > 0, "{stdout}");
    assert_eq!(number_after(&stdout, "traffic: "), 2 * 8 * 30, "{stdout}");
    let demo = number_after(&stdout, "clients in this process (PID ");
    let peer = number_after(&stdout, "servers in the peer process PID ");
    assert_ne!(demo, peer);
    assert!(process_gone(peer), "the peer process {peer} is still there");
    let leftovers = run_directories(demo);
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

/// The run directories of demo process `pid` in the temporary directory.
fn run_directories(pid: u64) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .expect("the temporary directory")
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("tierbuf-demo-{pid}-"))
        })
        .map(|entry| entry.path())
        .collect()
}

/// The peer process the demo process `demo` started, once it runs.
fn peer_of(demo: u32) -> Option<u64> {
    let parent = format!(" {demo} ");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .find(|pid| {
            // The state, then the parent's id, follow the command name.
            let child = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest[1..].starts_with(&parent))
            });
            child && !process_gone(*pid)
        })
}

/// A child process killed when dropped, so that a failing test leaves none behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_shm_demo_leaves_no_peer_behind() {
    let mut demo = Killed(
        Command::new(env!("CARGO_BIN_EXE_tierbuf"))
            .args([
                "demo",
                "--provider",
                "shm",
                "--connections",
                "2",
                "--messages",
                "100000000",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("run tierbuf"),
    );
    let pid = demo.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let peer = loop {
        // Traffic runs once the peer is there and the run directory is gone.
        if let Some(peer) = peer_of(pid)
            && run_directories(pid.into()).is_empty()
        {
            break peer;
        }
        assert!(
            demo.0.try_wait().expect("the demo's state").is_none(),
            "the demo ended early"
        );
        assert!(
            Instant::now() < deadline,
            "the demo started no peer process"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    demo.0.kill().expect("kill the demo");
    demo.0.wait().expect("reap the demo");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !process_gone(peer) {
        assert!(
            Instant::now() < deadline,
            "the peer process {peer} outlived the demo"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `tierbuf ARGS` under `sh` after `ulimit ULIMIT` (`-n` sets both limits, `-Sn` the soft
/// one).
fn tierbuf_with_ulimit(ulimit: &str, args: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" {args}"))
        .arg(env!("CARGO_BIN_EXE_tierbuf"))
        .output()
        .expect("run sh")
}

#[test]
fn a_low_soft_open_file_limit_is_raised_for_shm() {
    let output = tierbuf_with_ulimit(
        "-Sn 128",
        "demo --provider shm --connections 40 --messages 4",
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("40 connection pairs on shm"));
}

#[test]
fn too_many_shm_connections_for_the_hard_open_file_limit_are_refused() {
    let output = tierbuf_with_ulimit("-n 256", "demo --provider shm --connections 2000");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("open files") && stderr.contains("or fewer"),
        "{stderr}"
    );
}

#[test]
fn the_peer_subcommand_is_hidden() {
    let output = tierbuf(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("demo") && !help.contains("demo-peer"),
        "{help}"
    );
}

#[test]
fn a_ladder_file_runs_too() {
    let ladder = concat!(env!("CARGO_MANIFEST_DIR"), "/ladders/storage.toml");
    let output = tierbuf(&[
        "demo",
        "--ladder",
        ladder,
        "--connections",
        "4",
        "--messages",
        "10",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("storage.toml"));
}

#[test]
fn an_unknown_preset_is_refused() {
    let output = tierbuf(&["demo", "--preset", "huge"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("huge"));
}

#[test]
fn a_missing_ladder_file_is_named() {
    let output = tierbuf(&["demo", "--ladder", "/nonexistent/ladder.toml"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/ladder.toml"));
}

#[test]
fn zero_connections_is_refused() {
    let output = tierbuf(&["demo", "--connections", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 1"));
}
