//! The README's quick start is the first example of this crate's documentation
//! (`src/lib.rs`), which `cargo test --doc` compiles and runs: this test keeps the two the
//! same, so the README shows code that is tested.

/// The lines of the first fenced code block in `lines` that is Rust (a fence of "```rust"
/// or a bare one), less those rustdoc hides ("# ...").
fn first_rust_block<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    lines
        .skip_while(|line| !matches!(line.trim_end(), "```rust" | "```"))
        .skip(1)
        .take_while(|line| line.trim_end() != "```")
        .filter(|line| *line != "#" && !line.starts_with("# "))
        .collect()
}

#[test]
fn the_readme_quick_start_is_the_crate_documentation_s_tested_example() {
    let readme = include_str!("../../README.md");
    let lib = include_str!("../src/lib.rs");
    let crate_doc = lib
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .map(|line| {
            line.strip_prefix("//! ")
                .unwrap_or(line.trim_start_matches("//!"))
        });
    let example = first_rust_block(crate_doc);
    let quick_start = first_rust_block(readme.lines().skip_while(|line| *line != "## Quick start"));
    assert!(
        example.len() > 10,
        "the crate documentation's first example"
    );
    assert_eq!(
        quick_start, example,
        "README.md's quick start and the first example of transport/src/lib.rs differ"
    );
}
