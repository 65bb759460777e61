//! Where the golden data recorded from Caffe2 lives for the Rust tests: `tests/golden` at the
//! repository root (see its README), or `$FERROCAFFE_GOLDEN`. The one copy of this helper;
//! test crates reach it with `mod golden_data;`.

use std::path::{Path, PathBuf};

/// The corpus root.
pub fn golden_dir() -> PathBuf {
    match std::env::var_os("FERROCAFFE_GOLDEN") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden"),
    }
}

/// A file recorded beside the corpora (`op-catalog.json`, `caffe2-wire-format.json`): inside
/// the corpus root in the repository, one level up where `$FERROCAFFE_GOLDEN` points at a copy
/// laid out as the original recording.
#[allow(dead_code)] // not every test crate reads the side files
pub fn side_file(name: &str) -> PathBuf {
    let root = golden_dir();
    let inside = root.join(name);
    if inside.exists() {
        inside
    } else {
        root.join("..").join(name)
    }
}
