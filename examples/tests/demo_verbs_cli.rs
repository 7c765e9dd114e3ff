//! `tierbuf demo --provider verbs` as far as it runs without an RDMA device: its flags are
//! checked as usage errors, a build without the `verbs` feature refuses it saying how to
//! rebuild, and a build with it names a device it cannot open.

use std::process::Output;

fn tierbuf(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tierbuf"))
        .args(args)
        .output()
        .expect("run tierbuf")
}

/// Asserts that `output` is a usage error (exit status 2) whose message has every one of
/// `words`.
fn assert_usage_error(output: &Output, words: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for word in words {
        assert!(stderr.contains(word), "missing {word:?} in\n{stderr}");
    }
}

#[test]
fn verbs_without_a_device_is_a_usage_error() {
    let output = tierbuf(&["demo", "--provider", "verbs", "--peer", "192.0.2.7:7471"]);
    assert_usage_error(&output, &["--device"]);
}

#[test]
fn verbs_without_listen_or_peer_is_a_usage_error() {
    let output = tierbuf(&["demo", "--provider", "verbs", "--device", "mlx5_0"]);
    assert_usage_error(&output, &["--listen", "--peer"]);
}

#[test]
fn listen_and_peer_together_are_a_usage_error() {
    let output = tierbuf(&[
        "demo",
        "--provider",
        "verbs",
        "--device",
        "mlx5_0",
        "--listen",
        "0.0.0.0:7471",
        "--peer",
        "192.0.2.7:7471",
    ]);
    assert_usage_error(&output, &["--listen", "--peer", "cannot be used with"]);
}

#[test]
fn a_gid_index_without_a_device_is_a_usage_error() {
    let output = tierbuf(&[
        "demo",
        "--provider",
        "verbs",
        "--gid-index",
        "3",
        "--peer",
        "192.0.2.7:7471",
    ]);
    assert_usage_error(&output, &["--device"]);
}

#[test]
fn verbs_flags_with_another_provider_are_a_usage_error() {
    let output = tierbuf(&["demo", "--device", "mlx5_0"]);
    assert_usage_error(
        &output,
        &["--device goes only with --provider verbs", "loopback"],
    );
    let output = tierbuf(&[
        "demo",
        "--provider",
        "shm",
        "--device",
        "mlx5_0",
        "--peer",
        "192.0.2.7:7471",
    ]);
    assert_usage_error(
        &output,
        &["--device and --peer go only with --provider verbs", "shm"],
    );
}

#[cfg(not(feature = "verbs"))]
#[test]
fn without_the_feature_verbs_is_refused_saying_how_to_rebuild() {
    let output = tierbuf(&[
        "demo",
        "--provider",
        "verbs",
        "--device",
        "mlx5_0",
        "--peer",
        "127.0.0.1:1",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for words in ["--features verbs", "libibverbs1", "docs/verbs.md"] {
        assert!(stderr.contains(words), "missing {words:?} in\n{stderr}");
    }
}

/// Asserts that `output` failed to open the device `nosuchdev`, with the provider's error
/// for the devices this machine has (none can be listed, none is present, or these are
/// the ones found).
#[cfg(feature = "verbs")]
fn assert_no_such_device(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("RDMA device \"nosuchdev\"") && stderr.contains("opening the device"),
        "{stderr}"
    );
    assert!(
        [
            "no RDMA devices can be listed",
            "no RDMA devices found",
            "no RDMA device is named \"nosuchdev\"; devices found: ",
        ]
        .iter()
        .any(|message| stderr.contains(message)),
        "{stderr}"
    );
}

#[cfg(feature = "verbs")]
#[test]
fn a_device_that_is_not_there_is_named_by_the_client_side() {
    let output = tierbuf(&[
        "demo",
        "--provider",
        "verbs",
        "--device",
        "nosuchdev",
        "--peer",
        "127.0.0.1:1",
    ]);
    assert_no_such_device(&output);
}

#[cfg(feature = "verbs")]
#[test]
fn a_device_that_is_not_there_is_named_by_the_listening_side() {
    let output = tierbuf(&[
        "demo",
        "--provider",
        "verbs",
        "--device",
        "nosuchdev",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_no_such_device(&output);
}
