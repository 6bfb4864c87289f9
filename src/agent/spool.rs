//! Bounded on-disk spool for messages produced while the broker is unreachable: one fsynced
//! file per message, named by a monotonic id, replayed in id order and deleted once acknowledged.
//! Messages the broker refuses go to a dead-letter folder inside the spool (`dead/`, at most
//! [`MAX_DEAD_LETTERS`], oldest dropped first) with the reason beside each, never retried.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("spool entry {path} is corrupt")]
    Corrupt { path: PathBuf },
}

/// A spooled message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolEntry {
    pub id: u64,
    pub topic: String,
    pub payload: Vec<u8>,
}

/// The spool: entries on disk plus a send cursor (entries before it are in flight).
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    entries: BTreeMap<u64, u64>,
    bytes: u64,
    next_id: u64,
    cursor: u64,
}

const EXT: &str = "msg";

/// The dead-letter folder, inside the spool folder.
pub const DEAD_DIR: &str = "dead";

/// Most messages kept in the dead-letter folder; the oldest go first.
pub const MAX_DEAD_LETTERS: usize = 1000;

/// The largest message id taken from a spool file's name (2^53: at a million messages a second,
/// 285 years of them).
const MAX_ID: u64 = 1 << 53;

impl Spool {
    /// Opens (creating) the spool folder and indexes what a previous run left there.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, SpoolError> {
        let io = |source| SpoolError::Io { path: dir.to_path_buf(), source };
        fs::create_dir_all(dir).map_err(io)?;
        let mut entries = BTreeMap::new();
        let mut bytes = 0;
        for e in fs::read_dir(dir).map_err(io)? {
            let e = e.map_err(io)?;
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') && name.ends_with(".tmp") {
                // a write interrupted by a crash: never acknowledged to anyone
                let _ = fs::remove_file(&p);
                continue;
            }
            // ids count up from 1 by one per message: one past MAX_ID is not a file this spool
            // wrote, and taking it would leave no room to count on
            if let Some(id) = name.strip_suffix(&format!(".{EXT}")).and_then(|s| s.parse::<u64>().ok()).filter(|&id| id <= MAX_ID) {
                let len = e.metadata().map_err(io)?.len();
                entries.insert(id, len);
                bytes += len;
            }
        }
        let next_id = entries.keys().next_back().map_or(1, |k| k + 1);
        let cursor = entries.keys().next().copied().unwrap_or(next_id);
        Ok(Self { dir: dir.to_path_buf(), max_bytes, entries, bytes, next_id, cursor })
    }

    fn file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:020}.{EXT}"))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Whether another message may be appended (sources pause when not).
    pub fn has_room(&self) -> bool {
        self.bytes < self.max_bytes
    }
    /// Whether some entry has not been handed to the broker since the last rewind.
    pub fn has_unsent(&self) -> bool {
        self.entries.range(self.cursor..).next().is_some()
    }

    /// Appends a message durably (written, fsynced, renamed into place, folder fsynced).
    pub fn append(&mut self, topic: &str, payload: &[u8]) -> Result<u64, SpoolError> {
        let id = self.next_id;
        let path = self.file(id);
        let tmp = self.dir.join(format!(".{id:020}.tmp"));
        let io = |source| SpoolError::Io { path: path.clone(), source };
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(&(topic.len() as u32).to_le_bytes()).map_err(io)?;
        f.write_all(topic.as_bytes()).map_err(io)?;
        f.write_all(payload).map_err(io)?;
        f.sync_all().map_err(io)?;
        fs::rename(&tmp, &path).map_err(io)?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io)?;
        let len = 4 + topic.len() as u64 + payload.len() as u64;
        self.entries.insert(id, len);
        self.bytes += len;
        self.next_id += 1;
        Ok(id)
    }

    /// The next entry not yet handed out since the last rewind; advances the cursor.
    pub fn next_unsent(&mut self) -> Result<Option<SpoolEntry>, SpoolError> {
        let Some(&id) = self.entries.range(self.cursor..).next().map(|(k, _)| k) else { return Ok(None) };
        self.cursor = id + 1;
        let path = self.file(id);
        let data = fs::read(&path).map_err(|source| SpoolError::Io { path: path.clone(), source })?;
        let corrupt = || SpoolError::Corrupt { path: path.clone() };
        let n = u32::from_le_bytes(data.get(..4).ok_or_else(corrupt)?.try_into().map_err(|_| corrupt())?) as usize;
        let topic = std::str::from_utf8(data.get(4..4 + n).ok_or_else(corrupt)?).map_err(|_| corrupt())?.to_string();
        Ok(Some(SpoolEntry { id, topic, payload: data[4 + n..].to_vec() }))
    }

    /// Drops an entry that could not be read (counted by the caller) so replay goes on.
    pub fn discard(&mut self, id: u64) {
        self.remove(id).ok();
    }

    /// Deletes an acknowledged entry.
    pub fn remove(&mut self, id: u64) -> Result<(), SpoolError> {
        if let Some(len) = self.entries.remove(&id) {
            self.bytes -= len;
            let path = self.file(id);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(SpoolError::Io { path, source }),
            }
        }
        Ok(())
    }

    /// Moves entry `id` to the dead-letter folder, with `reason` beside it; returns its new path.
    pub fn dead_letter(&mut self, id: u64, reason: &str) -> Result<PathBuf, SpoolError> {
        let from = self.file(id);
        let to = self.dead_path(id)?;
        let io = |source| SpoolError::Io { path: to.clone(), source };
        self.write_reason(id, reason)?;
        fs::rename(&from, &to).map_err(io)?;
        if let Some(len) = self.entries.remove(&id) {
            self.bytes -= len;
        }
        self.trim_dead();
        Ok(to)
    }

    /// Writes a message that was never spooled straight to the dead-letter folder.
    pub fn dead_letter_new(&mut self, topic: &str, payload: &[u8], reason: &str) -> Result<PathBuf, SpoolError> {
        let id = self.next_id;
        self.next_id += 1;
        let to = self.dead_path(id)?;
        let io = |source| SpoolError::Io { path: to.clone(), source };
        self.write_reason(id, reason)?;
        let mut f = File::create(&to).map_err(io)?;
        f.write_all(&(topic.len() as u32).to_le_bytes()).map_err(io)?;
        f.write_all(topic.as_bytes()).map_err(io)?;
        f.write_all(payload).map_err(io)?;
        f.sync_all().map_err(io)?;
        self.trim_dead();
        Ok(to)
    }

    fn dead_path(&self, id: u64) -> Result<PathBuf, SpoolError> {
        let dir = self.dir.join(DEAD_DIR);
        fs::create_dir_all(&dir).map_err(|source| SpoolError::Io { path: dir.clone(), source })?;
        Ok(dir.join(format!("{id:020}.{EXT}")))
    }

    fn write_reason(&self, id: u64, reason: &str) -> Result<(), SpoolError> {
        let path = self.dir.join(DEAD_DIR).join(format!("{id:020}.reason"));
        fs::write(&path, format!("{reason}\n")).map_err(|source| SpoolError::Io { path, source })
    }

    /// Keeps the newest [`MAX_DEAD_LETTERS`] dead letters.
    fn trim_dead(&self) {
        let dir = self.dir.join(DEAD_DIR);
        let Ok(rd) = fs::read_dir(&dir) else { return };
        let mut ids: Vec<String> =
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(&format!(".{EXT}")).map(String::from)).collect();
        if ids.len() <= MAX_DEAD_LETTERS {
            return;
        }
        ids.sort();
        for id in &ids[..ids.len() - MAX_DEAD_LETTERS] {
            let _ = fs::remove_file(dir.join(format!("{id}.{EXT}")));
            let _ = fs::remove_file(dir.join(format!("{id}.reason")));
        }
    }

    /// After a disconnect: entries handed out but not acknowledged are sent again, in order.
    pub fn rewind(&mut self) {
        self.cursor = self.entries.keys().next().copied().unwrap_or(self.next_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_named_past_the_largest_id_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(format!("{}.{EXT}", u64::MAX)), b"x").unwrap();
        std::fs::write(d.path().join(format!("{}.{EXT}", MAX_ID + 1)), b"x").unwrap();
        let mut s = Spool::open(d.path(), 1 << 20).unwrap();
        assert_eq!(s.append("t/a", b"m").unwrap(), 1);
    }

    #[test]
    fn append_replay_rewind_and_reopen() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Spool::open(d.path(), 1 << 20).unwrap();
        for i in 0..3 {
            s.append("t/a", format!("m{i}").as_bytes()).unwrap();
        }
        let a = s.next_unsent().unwrap().unwrap();
        assert_eq!((a.topic.as_str(), a.payload.as_slice()), ("t/a", &b"m0"[..]));
        let b = s.next_unsent().unwrap().unwrap();
        s.remove(a.id).unwrap();
        s.rewind();
        assert_eq!(s.next_unsent().unwrap().unwrap().id, b.id);
        drop(s);
        let mut s = Spool::open(d.path(), 1 << 20).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.next_unsent().unwrap().unwrap().payload, b"m1");
        let id = s.append("t/b", b"m3").unwrap();
        assert!(id > b.id);
    }

    #[test]
    fn refused_messages_go_to_the_dead_letter_folder_and_stay_bounded() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Spool::open(d.path(), 1 << 20).unwrap();
        let a = s.append("t/a", b"poison").unwrap();
        let b = s.append("t/a", b"fine").unwrap();
        let moved = s.dead_letter(a, "NotAuthorized").unwrap();
        assert_eq!(moved, d.path().join(DEAD_DIR).join(format!("{a:020}.{EXT}")));
        assert_eq!(std::fs::read_to_string(moved.with_extension("reason")).unwrap(), "NotAuthorized\n");
        // the rest of the spool goes on; the dead letter is never handed out again
        assert_eq!(s.len(), 1);
        assert_eq!(s.next_unsent().unwrap().unwrap().id, b);
        s.rewind();
        let live = s.dead_letter_new("t/b", b"live", "PacketTooLarge").unwrap();
        assert!(std::fs::read(&live).unwrap().ends_with(b"t/blive"));
        drop(s);
        // a reopened spool does not take dead letters for entries
        let mut s = Spool::open(d.path(), 1 << 20).unwrap();
        assert_eq!(s.len(), 1);
        for i in 0..MAX_DEAD_LETTERS + 5 {
            s.dead_letter_new("t", format!("{i}").as_bytes(), "x").unwrap();
        }
        let kept = std::fs::read_dir(d.path().join(DEAD_DIR)).unwrap().count();
        assert_eq!(kept, 2 * MAX_DEAD_LETTERS, "messages and reasons");
        assert!(!live.exists(), "the oldest went first");
    }

    #[test]
    fn bounded() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Spool::open(d.path(), 20).unwrap();
        assert!(s.has_room());
        s.append("t", &[0u8; 30]).unwrap();
        assert!(!s.has_room());
    }
}
