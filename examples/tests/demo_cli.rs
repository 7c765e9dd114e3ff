//! `tierbuf demo` as a user runs it: a small run succeeds and reports tier changes; bad
//! flags and bad ladder files fail with a clear message and a non-zero exit.

use std::process::Command;

fn tierbuf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tierbuf"))
        .args(args)
        .output()
        .expect("run tierbuf")
}

#[test]
fn a_small_demo_runs_promotes_demotes_and_reports() {
    let output = tierbuf(&[
        "demo",
        "--connections",
        "16",
        "--messages",
        "30",
        "--large-every",
        "3",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "16 connection pairs on loopback, ladder preset patent",
        "static top tier up front (from the ladder)",
        "tiered, peak during traffic (measured)",
        "small (tier 0)",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    let changes = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("promotions"))
        .expect("a tier-change line");
    let numbers: Vec<u64> = changes
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    assert!(
        numbers[0] > 0 && numbers[1] > 0,
        "no promotions or demotions: {changes}"
    );
    assert!(
        stdout.contains("after the quiet phase: 0 send directions"),
        "every connection steps back down:\n{stdout}"
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
