//! The committed corpus as plain tests, on stable and without libFuzzer: every input of
//! `corpus/<target>/` passes its target's harness, and the seeds there (`seed-*`) are
//! exactly what the harnesses' `seeds` make. `TIERBUF_WRITE_SEEDS=1 cargo test
//! --manifest-path fuzz/Cargo.toml` writes them instead (and removes seeds no longer made),
//! and replays nothing: run the tests again after.

use std::fs;
use std::path::{Path, PathBuf};

use tierbuf_fuzz::TARGETS;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The files of `dir` whose names start with `prefix`, sorted.
fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(prefix))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_committed_seeds_are_what_the_harnesses_make() {
    let write = std::env::var_os("TIERBUF_WRITE_SEEDS").is_some();
    for target in TARGETS {
        let dir = corpus(target.name);
        let seeds = (target.seeds)();
        if write {
            fs::create_dir_all(&dir).unwrap();
            for stale in files(&dir, "seed-") {
                fs::remove_file(stale).unwrap();
            }
        }
        let mut expected: Vec<PathBuf> = Vec::new();
        for (name, bytes) in &seeds {
            let path = dir.join(format!("seed-{name}"));
            if write {
                fs::write(&path, bytes).unwrap();
            }
            let committed = fs::read(&path)
                .unwrap_or_else(|error| panic!("{}: {error} (write the seeds)", path.display()));
            assert!(
                &committed == bytes,
                "{} differs from its seed (write the seeds)",
                path.display()
            );
            expected.push(path);
        }
        expected.sort();
        assert_eq!(files(&dir, "seed-"), expected, "seeds of {}", target.name);
    }
}

#[test]
fn every_committed_input_passes_its_target() {
    if std::env::var_os("TIERBUF_WRITE_SEEDS").is_some() {
        // The other test is writing the seeds meanwhile: replay them in the next run.
        return;
    }
    for target in TARGETS {
        let inputs = files(&corpus(target.name), "");
        assert!(!inputs.is_empty(), "no corpus for {}", target.name);
        for path in inputs {
            let input = fs::read(&path).unwrap();
            println!("{}", path.display());
            (target.run)(&input);
        }
    }
}
