//! Reading input with a bound: what a file or a pipe holds is read up to a cap and refused one
//! byte past it, without reading the rest, so a machine's memory never depends on what a file
//! claims to be. Special files (FIFOs, devices, sockets) named as a config or component path
//! are refused by name: they can be endless and are never what such a path should be.

use std::io::Read;
use std::path::Path;

/// `text` cut to at most `max` bytes, at a character boundary (a name, a label or a line shown
/// within a bound).
pub fn cut_to(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// The largest `homing.toml` the host reads.
pub const MAX_CONFIG_SIZE: u64 = 4 << 20;

/// Why bounded input was refused.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// More than the cap.
    #[error("{what} is over {limit} of {cap} bytes")]
    TooLarge {
        /// What was read ("the payload", "the config file").
        what: String,
        /// The setting or rule that sets the cap.
        limit: String,
        /// The cap, in bytes.
        cap: u64,
    },
    /// Not a regular file.
    #[error("{what} {path} is not a regular file ({kind}); give the path of a file")]
    NotAFile {
        /// What the path was given as.
        what: String,
        /// The path.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// The read failed.
    #[error("cannot read {what}: {source}")]
    Io {
        /// What was read.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Reads `reader` to its end, refusing it at once when it holds more than `cap` bytes (`what`
/// and `limit` name it and the setting in the error). Reads at most `cap + 1` bytes.
///
/// # Errors
///
/// [`InputError::TooLarge`] past the cap, [`InputError::Io`] when the read fails.
pub fn read_capped(
    reader: impl Read,
    cap: u64,
    what: &str,
    limit: &str,
) -> Result<Vec<u8>, InputError> {
    let mut out = Vec::new();
    reader
        .take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| InputError::Io {
            what: what.to_owned(),
            source,
        })?;
    if out.len() as u64 > cap {
        return Err(InputError::TooLarge {
            what: what.to_owned(),
            limit: limit.to_owned(),
            cap,
        });
    }
    Ok(out)
}

/// Reads the regular file at `path` with [`read_capped`], refusing special files by name and
/// a file whose size is over the cap before reading any of it.
///
/// # Errors
///
/// As [`read_capped`], and [`InputError::NotAFile`] for a FIFO, device, socket or directory.
pub fn read_file_capped(
    path: &Path,
    cap: u64,
    what: &str,
    limit: &str,
) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io {
        what: format!("{what} {}", path.display()),
        source,
    };
    check_regular(path, what)?;
    let file = std::fs::File::open(path).map_err(io)?;
    // Checked again on the open file: the path may have been swapped since.
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(not_a_file(path, what, &meta));
    }
    if meta.len() > cap {
        return Err(InputError::TooLarge {
            what: format!("{what} {}", path.display()),
            limit: limit.to_owned(),
            cap,
        });
    }
    read_capped(file, cap, &format!("{what} {}", path.display()), limit)
}

/// Refuses `path` when it exists and is not a regular file (following symlinks).
///
/// # Errors
///
/// [`InputError::NotAFile`] naming what it is; [`InputError::Io`] when it cannot be examined.
pub fn check_regular(path: &Path, what: &str) -> Result<(), InputError> {
    let meta = std::fs::metadata(path).map_err(|source| InputError::Io {
        what: format!("{what} {}", path.display()),
        source,
    })?;
    if meta.is_file() {
        Ok(())
    } else {
        Err(not_a_file(path, what, &meta))
    }
}

fn not_a_file(path: &Path, what: &str, meta: &std::fs::Metadata) -> InputError {
    InputError::NotAFile {
        what: what.to_owned(),
        path: path.display().to_string(),
        kind: kind_of(meta),
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_reader_is_read_up_to_its_cap_and_refused_one_byte_past_it() {
        assert_eq!(read_capped(&b"abcd"[..], 4, "x", "y").unwrap(), b"abcd");
        let err =
            read_capped(std::io::repeat(0), 4, "the payload", "[host] max_payload").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the payload is over [host] max_payload of 4 bytes"
        );
    }

    #[test]
    fn devices_and_directories_are_refused_by_name() {
        let err = read_file_capped(Path::new("/dev/zero"), 10, "config file", "x").unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let err = read_file_capped(Path::new("/"), 10, "config file", "x").unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
    }
}
