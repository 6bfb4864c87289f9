//! Bounded reads of the files that operators and updates name: configs, passwords, certificates,
//! model files. A path may point anywhere (`/dev/zero`, a FIFO, a file still growing), so a
//! file is read only when it is a regular file, and never past a cap. Uses nothing else of the
//! crate.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Reads `path` whole, which must be a regular file of at most `max` bytes. The file is opened
/// without blocking (opening a FIFO would otherwise wait for a writer), checked, and read
/// through a cap, so a file that grows after the look at its size cannot exceed `max` either.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let (f, len) = open_regular(path, max)?;
    let mut out = Vec::with_capacity(len as usize);
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("more than the {max} bytes allowed")));
    }
    Ok(out)
}

/// The sha256 of `path` (lowercase hex), streamed: the same checks as [`read_bounded`], without
/// holding the file in memory.
pub fn sha256_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let (f, _) = open_regular(path, max)?;
    let mut h = Sha256::new();
    let n = std::io::copy(&mut f.take(max + 1), &mut h)?;
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("more than the {max} bytes allowed")));
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Opens `path` without blocking and checks that it is a regular file of at most `max` bytes;
/// returns it with its length.
fn open_regular(path: &Path, max: u64) -> std::io::Result<(std::fs::File, u64)> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} bytes, more than the {max} allowed", meta.len())));
    }
    Ok((f, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        assert_eq!(read_bounded(Path::new("/dev/zero"), 10).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_bounded(dir.path(), 10).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // returns at once: no writer is waited for
        assert_eq!(read_bounded(&fifo, 10).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 2000]).unwrap();
        assert!(read_bounded(&big, 1000).unwrap_err().to_string().contains("2000 bytes"));
        assert_eq!(read_bounded(&big, 2000).unwrap().len(), 2000);
        // sha256sum of 2000 'x'
        let want = {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(vec![b'x'; 2000]))
        };
        assert_eq!(sha256_bounded(&big, 2000).unwrap(), want);
        assert!(sha256_bounded(&big, 1999).is_err());
        assert!(sha256_bounded(&fifo, 10).is_err());
    }
}
