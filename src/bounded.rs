//! Every read of something kprov did not write itself in this run (a file named by a flag,
//! stdin, a state-store object, a kubeconfig) goes through here, with a limit: `/dev/zero`,
//! `/dev/urandom` or a tampered 10 GB object end in a clear error naming the input and the
//! limit, not in a process the kernel kills.
//!
//! The helpers read at most `limit + 1` bytes, so the answer is prompt whatever the source,
//! and a file of exactly `limit` bytes is still accepted.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A cluster spec file or stdin (`create -f`, `replace -f`, what `edit` reads back).
pub const SPEC: u64 = 4 * MIB;
/// An inventory file (`--inventory`).
pub const INVENTORY: u64 = 4 * MIB;
/// An OpenSSH public key file (`--ssh-public-key`, `~/.ssh/id_*.pub`).
pub const SSH_PUBLIC_KEY: u64 = 64 * KIB;
/// A kubeconfig file kprov reads (to merge into it, or to find a context).
pub const KUBECONFIG: u64 = 16 * MIB;
/// One object of the state store (specs, plans, certificates, kubeconfigs, manifests).
pub const STATE_OBJECT: u64 = 32 * MIB;
/// A node binary or tarball from a `file://` asset mirror (containerd's tarball is ~40 MB).
pub const LOCAL_ASSET: u64 = 1024 * MIB;

/// Why a bounded read failed; every variant names the input as the caller described it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The system refused the open or the read (missing file, permissions, a broken pipe).
    #[error("{what}: cannot read: {source}")]
    Io {
        /// The input as the caller names it (a path, `stdin`, a state-store key).
        what: String,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The input holds more than `limit` bytes; only `limit + 1` of them were read.
    #[error("{what} is larger than the limit of {} ({limit} bytes); is it the right file?", human(*limit))]
    TooLarge {
        /// The input as the caller names it.
        what: String,
        /// The largest size accepted, in bytes.
        limit: u64,
    },
    /// A read meant to give text found bytes that are not UTF-8.
    #[error("{what} is not UTF-8 text")]
    NotText {
        /// The input as the caller names it.
        what: String,
    },
}

impl ReadError {
    /// The I/O error kind, when the read failed in the system (e.g. `NotFound`).
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            ReadError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

fn human(n: u64) -> String {
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

/// Reads all of `r` if it holds at most `limit` bytes; `what` names it in errors.
pub fn read(r: impl Read, what: &str, limit: u64) -> Result<Vec<u8>, ReadError> {
    let mut buf = Vec::new();
    r.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|source| ReadError::Io {
            what: what.to_string(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            what: what.to_string(),
            limit,
        });
    }
    Ok(buf)
}

fn text(buf: Vec<u8>, what: &str) -> Result<String, ReadError> {
    String::from_utf8(buf).map_err(|_| ReadError::NotText {
        what: what.to_string(),
    })
}

/// Reads the file at `path` (named by its path in errors).
pub fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let what = path.display().to_string();
    let f = File::open(path).map_err(|source| ReadError::Io {
        what: what.clone(),
        source,
    })?;
    read(f, &what, limit)
}

/// Reads the file at `path` as UTF-8 text.
pub fn read_file_to_string(path: &Path, limit: u64) -> Result<String, ReadError> {
    let what = path.display().to_string();
    text(read_file(path, limit)?, &what)
}

/// Reads standard input as UTF-8 text (named `<stdin>` in errors).
pub fn read_stdin_to_string(limit: u64) -> Result<String, ReadError> {
    let what = "<stdin>";
    text(read(io::stdin().lock(), what, limit)?, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_exact_and_prompt() {
        assert_eq!(read(&b"abcd"[..], "x", 4).unwrap(), b"abcd");
        let e = read(&b"abcde"[..], "x", 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x is larger than the limit of 4 bytes (4 bytes); is it the right file?"
        );
        // An endless source ends promptly.
        let e = read_file(Path::new("/dev/zero"), SPEC).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { limit: SPEC, .. }), "{e}");
        assert!(
            e.to_string()
                .contains("/dev/zero is larger than the limit of 4 MiB")
        );
        let e = read_file(Path::new("/nonexistent/kprov"), SPEC).unwrap_err();
        assert_eq!(e.io_kind(), Some(io::ErrorKind::NotFound));
        let e = text(vec![0xff, 0xfe], "f").unwrap_err();
        assert_eq!(e.to_string(), "f is not UTF-8 text");
    }
}
