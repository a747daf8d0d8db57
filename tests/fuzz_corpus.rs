//! Replays the committed `cargo fuzz` corpus (`fuzz/corpus/TARGET/`) through the functions
//! the fuzz targets call (`release_harness::tools::fuzzing::TARGETS`), on the stable toolchain: no
//! input may panic, nor make the parser hold more memory than a bound linear in its size.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]
// A global allocator that counts is the one unsafe code of the package.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use release_harness::tools::fuzzing::TARGETS;

/// The system allocator, counting live heap bytes and their peak. Fuzzing bounds a single
/// allocation (`-malloc_limit_mb`); here each input's peak is bounded instead.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(live, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Most heap one input may make a parser hold: generous, but linear in the input.
fn heap_bound(input_len: usize) -> usize {
    (1 << 20) + 256 * input_len
}

#[test]
fn every_corpus_input_parses_without_panic_within_a_linear_heap_bound() {
    let mut failures = Vec::new();
    for (name, run) in TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "the {name} corpus is empty");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let before = LIVE.load(Relaxed);
            PEAK.store(before, Relaxed);
            let outcome = catch_unwind(AssertUnwindSafe(|| run(&data)));
            let held = PEAK.load(Relaxed).saturating_sub(before);
            match outcome {
                Err(_) => failures.push(format!("{}: panicked", file.display())),
                Ok(()) if held > heap_bound(data.len()) => failures.push(format!(
                    "{}: held {held} bytes for a {}-byte input",
                    file.display(),
                    data.len()
                )),
                Ok(()) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fuzz_target_is_declared_and_replayed() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect();
    on_disk.sort();
    let mut replayed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    replayed.sort();
    assert_eq!(
        on_disk, replayed,
        "fuzz/fuzz_targets/ and fuzzing::TARGETS differ"
    );
    for (name, _) in TARGETS {
        let source =
            std::fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs")))
                .unwrap();
        assert!(
            source.contains(&format!("release_harness::tools::fuzzing::{name}(data)")),
            "fuzz target {name} calls another function"
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
    }
}
