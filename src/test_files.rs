//! Files for unit tests: a temporary tree written in one call.

use std::path::Path;

/// A temporary directory holding `files` (path below it, text), their directories made.
pub(crate) fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in files {
        write(dir.path(), file, text);
    }
    dir
}

/// Writes `content` to `file` below `dir`, making its directories.
pub(crate) fn write(dir: &Path, file: &str, content: impl AsRef<[u8]>) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}
