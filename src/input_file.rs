//! The files the offline tools read (`check`, `seed`, `eval`): regular files of a bounded
//! size, read with that bound, so that a symlink to `/dev/zero`, a FIFO or a 2 GB bundle
//! is refused at once with a clear message instead of growing memory or blocking for ever.
//! Entry point: [`read_bounded`].

use std::io::Read;
use std::path::{Path, PathBuf};

/// `--max-bundle-bytes` when not given: far above any real run bundle or eval case
/// (examples/runs and eval/corpus hold 2 to 12 kB each).
pub const DEFAULT_MAX_BUNDLE_BYTES: u64 = 8 * 1024 * 1024;

/// A file the tools will not read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a regular file (it is a {kind}): give a JSON file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} holds more than {max} bytes (--max-bundle-bytes)")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{path} is not UTF-8 text")]
    NotUtf8 { path: PathBuf },
}

/// The text of the regular file at `path` (a symlink is followed), refused when it is
/// anything else or holds more than `max_bytes`. The size is checked before reading and
/// the read stops past `max_bytes`, so a file growing meanwhile is refused too.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<String, InputError> {
    let read_err = |source| InputError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(InputError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(&meta.file_type()),
        });
    }
    let too_large = || InputError::TooLarge {
        path: path.to_path_buf(),
        max: max_bytes,
    };
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|_| InputError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "FIFO";
        }
        if file_type.is_char_device() {
            return "character device";
        }
        if file_type.is_block_device() {
            return "block device";
        }
        if file_type.is_socket() {
            return "socket";
        }
    }
    if file_type.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = std::env::temp_dir().join(format!("input-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("b.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_bounded(&file, 2).unwrap(), "{}");
        assert!(matches!(
            read_bounded(&file, 1),
            Err(InputError::TooLarge { .. })
        ));
        assert!(matches!(
            read_bounded(&dir, 100),
            Err(InputError::NotRegular {
                kind: "directory",
                ..
            })
        ));
        #[cfg(unix)]
        {
            let link = dir.join("zero.json");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            assert!(matches!(
                read_bounded(&link, 100),
                Err(InputError::NotRegular {
                    kind: "character device",
                    ..
                })
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
