//! A shared region holds a file descriptor only while its memory file is being handed
//! out: a process may keep many more regions than its limit of open files.
//!
//! One test in its own binary: it counts the whole process's descriptors.

use tierbuf_pool::{HostRegistrar, MemoryBudget};

/// This process's open file descriptors.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn a_shared_region_holds_a_descriptor_only_while_its_file_is_handed_out() {
    let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 30));
    let before = open_files();
    let regions: Vec<_> = (0..64)
        .map(|_| registrar.register_shared(10_000, 4096).unwrap())
        .collect();
    assert_eq!(open_files(), before, "64 regions, no descriptor");
    // SAFETY: nothing else touches the regions' bytes.
    let file = unsafe { regions[0].expose_memory_file() }.unwrap();
    assert_eq!(open_files(), before + 1, "the file handed out");
    drop(file);
    assert_eq!(open_files(), before, "the mapping needs no descriptor");
}
