//! The example ladder files in `examples/ladders/` load and equal the presets they are named after.

use std::path::Path;

use tierbuf_tiers::ladder::{PRESET_NAMES, TierLadder};

#[test]
fn every_example_ladder_file_equals_its_preset() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("ladders");
    for name in PRESET_NAMES {
        let path = directory.join(format!("{name}.toml"));
        let from_file = TierLadder::from_file(&path).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(
            from_file,
            TierLadder::preset(name).unwrap(),
            "{}",
            path.display()
        );
    }
}

#[test]
fn every_example_ladder_file_is_a_preset() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("ladders");
    for entry in std::fs::read_dir(&directory).unwrap() {
        let path = entry.unwrap().path();
        let stem = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or_default();
        assert!(
            PRESET_NAMES.contains(&stem),
            "{} has no preset of its name",
            path.display()
        );
    }
}
