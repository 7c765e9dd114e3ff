//! `tierbuf ladder check` and `tierbuf ladder show`, run as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tierbuf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tierbuf"))
        .args(args)
        .output()
        .expect("the tierbuf binary runs")
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("ladders")
        .join(name)
}

/// Writes `text` to a file of its own under the test scratch directory.
fn scratch_file(name: &str, text: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn check_accepts_a_valid_file_and_prints_its_memory_table() {
    let path = example("two-tier.toml");
    let output = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    assert!(
        report.starts_with(&format!("{}: valid ladder, 2 tier(s)\n", path.display())),
        "{report}"
    );
    assert!(report.contains("10000 connections"), "{report}");
    assert!(report.contains("175.8 MiB"), "{report}"); // 10000 connections at 18 KiB
    assert!(stderr(&output).is_empty());
}

#[test]
fn check_totals_for_the_connections_asked_for() {
    let path = example("two-tier.toml");
    let output = tierbuf(&[
        "ladder",
        "check",
        "--connections",
        "4",
        path.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    let static_line = report
        .lines()
        .find(|line| line.starts_with("static"))
        .unwrap();
    let cells: Vec<&str> = static_line.split_whitespace().collect();
    assert_eq!(
        cells[cells.len() - 4..],
        ["258", "KiB", "1.0", "MiB"],
        "{report}"
    );
}

#[test]
fn check_rejects_an_invalid_file_with_its_line_and_column() {
    let path = scratch_file(
        "threshold-too-large.toml",
        "[[tier]]\nslot_size = \"512B\"\nslot_count = 16\npromote_threshold = \"1KiB\"\n",
    );
    let output = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).is_empty());
    assert_eq!(
        stderr(&output),
        format!(
            "error: {}:4:21: tier 0: promote_threshold 1024 exceeds the slot_size 512\n",
            path.display()
        )
    );
}

/// `check` approves only what a connection accepts: a ladder one slot per tier, or past a
/// bound on counts, sizes, the reserve or the policy's durations, is refused naming the key.
#[test]
fn check_rejects_a_ladder_no_connection_accepts_naming_the_key() {
    let tier = |slot_size: &str, slot_count: &str| {
        format!(
            "[[tier]]\nslot_size = {slot_size}\nslot_count = {slot_count}\npromote_threshold = 64\n"
        )
    };
    let cases = [
        (
            "one-slot.toml",
            tier("512", "1"),
            "3:14: tier 0: slot_count 1 is below 3",
        ),
        (
            "many-slots.toml",
            tier("64", "4294967296"),
            "3:14: tier 0: slot_count 4294967296 passes the maximum of 16384",
        ),
        (
            "huge-slots.toml",
            tier("\"4GiB\"", "3"),
            "2:13: tier 0: slot_size 4294967296 passes the maximum of 1073741824 bytes",
        ),
        (
            "reserve.toml",
            format!(
                "[policy]\nreservoir_regions = 9223372036854775807\n{}",
                tier("512", "3")
            ),
            "2:21: policy: reservoir_regions 9223372036854775807 passes the maximum of 1024",
        ),
        (
            "hysteresis.toml",
            format!(
                "[policy]\nhysteresis = \"18446744073709551615s\"\n{}",
                tier("512", "3")
            ),
            "2:14: policy: hysteresis",
        ),
    ];
    for (name, text, expected) in cases {
        let path = scratch_file(name, &text);
        let output = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1), "{name}: {}", stdout(&output));
        let message = stderr(&output);
        assert!(
            message.starts_with(&format!("error: {}:{expected}", path.display())),
            "{name}: {message}"
        );
    }
}

#[test]
fn check_rejects_a_toml_syntax_error_with_its_line_and_column() {
    let path = scratch_file(
        "syntax.toml",
        "[policy]\ndemote_after = \"30s\"\nhysteresis = 5s\n",
    );
    let output = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.starts_with(&format!("error: {}:3:14: ", path.display())),
        "{message}"
    );
}

#[test]
fn check_rejects_an_unknown_key_with_its_line_and_column() {
    let path = scratch_file("unknown-key.toml", "[[tier]]\nslot_size = 512\nslots = 4\n");
    let output = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.starts_with(&format!(
            "error: {}:3:1: unknown field `slots`",
            path.display()
        )),
        "{message}"
    );
}

#[test]
fn check_names_a_file_it_cannot_read() {
    let output = tierbuf(&["ladder", "check", "/nonexistent/ladder.toml"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).starts_with("error: cannot read ladder file /nonexistent/ladder.toml: ")
    );
}

#[test]
fn show_prints_a_preset_as_a_file_that_check_accepts() {
    let output = tierbuf(&[
        "ladder",
        "show",
        "--preset",
        "storage",
        "--connections",
        "100",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report = stdout(&output);
    assert!(
        report.starts_with("# preset storage\n[policy]\n"),
        "{report}"
    );
    assert!(report.contains("slot_size = \"1MiB\""), "{report}");
    assert!(report.contains("100 connections"), "{report}");

    let ladder_part = report.split("\nA connection at tier k").next().unwrap();
    let path = scratch_file("storage-shown.toml", ladder_part);
    let checked = tierbuf(&["ladder", "check", path.to_str().unwrap()]);
    assert!(checked.status.success(), "{}", stderr(&checked));
}

#[test]
fn show_reads_a_file_too() {
    let path = example("rpc.toml");
    let output = tierbuf(&["ladder", "show", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with(&format!("# from {}\n", path.display())));
}

#[test]
fn show_needs_exactly_one_source_and_a_known_preset() {
    assert_eq!(tierbuf(&["ladder", "show"]).status.code(), Some(2));
    let both = tierbuf(&[
        "ladder",
        "show",
        "--preset",
        "rpc",
        example("rpc.toml").to_str().unwrap(),
    ]);
    assert_eq!(both.status.code(), Some(2));
    let unknown = tierbuf(&["ladder", "show", "--preset", "huge"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("two-tier, rpc, storage"),
        "{}",
        stderr(&unknown)
    );
}
