//! Hot-folder source: notify wakes a scanner that takes a file once it is completely written
//! (renamed into place, or the same size and mtime for `settle`), oldest name first. Files
//! left over from a crash are found by the first scan. Moving to done/ or failed/ is the
//! publisher's job, after the outcome is safely delivered. [`manage`] runs the configured
//! folders and follows config edits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use notify::Watcher;
use tokio::sync::{mpsc, watch};

use crate::agent::config::{Config, SourceConfig};
use crate::agent::events::EventSink;
use crate::agent::messages::EventBody;
use crate::agent::pipeline::{Completion, ImageRef, Job, JobData};

/// A configured hot folder.
#[derive(Debug, Clone, PartialEq)]
pub struct FolderSource {
    pub id: String,
    pub path: PathBuf,
    pub done_dir: PathBuf,
    pub failed_dir: PathBuf,
    pub settle: Duration,
    pub scan_interval: Duration,
}

impl FolderSource {
    /// The hot folder a source entry configures; `None` for other kinds of source.
    pub fn of(s: &SourceConfig) -> Option<Self> {
        match s.clone() {
            SourceConfig::Folder { id, path, done_dir, failed_dir, settle, scan_interval } => {
                Some(Self { id, path, done_dir, failed_dir, settle, scan_interval })
            }
            _ => None,
        }
    }
}

/// Files of one folder handed to the pipeline and still in the folder (their outcome not yet
/// delivered, so not yet moved): shared by the folder's successive sources, so that a source
/// restarted by a config edit does not take them again.
pub type Taken = Arc<Mutex<HashSet<PathBuf>>>;

/// Runs the configured hot folders until `stop`: starts them, then follows config edits
/// (folders added, removed or changed; the others untouched). A folder's files already handed to
/// the pipeline stay its own across a restart ([`Taken`]); those of a removed folder still get
/// their outcome and move to done/ or failed/. At the end every folder source is stopped.
pub async fn manage(mut cfg: watch::Receiver<Arc<Config>>, intake: mpsc::Sender<Job>, mut stop: watch::Receiver<bool>, events: EventSink) {
    let mut running: Vec<(FolderSource, watch::Sender<bool>, tokio::task::JoinHandle<()>)> = Vec::new();
    let mut taken: BTreeMap<PathBuf, Taken> = BTreeMap::new();
    loop {
        let want: Vec<FolderSource> = cfg.borrow_and_update().folders().filter_map(FolderSource::of).collect();
        let (keep, gone): (Vec<_>, Vec<_>) = running.into_iter().partition(|(src, ..)| want.contains(src));
        running = keep;
        for (src, halt, task) in gone {
            tracing::info!(source = %src.id, path = %src.path.display(), "hot folder stopped (config)");
            let _ = halt.send(true);
            let _ = task.await;
        }
        for src in want {
            if running.iter().any(|(r, ..)| *r == src) {
                continue;
            }
            tracing::info!(source = %src.id, path = %src.path.display(), "hot folder starting");
            let files = taken.entry(src.path.clone()).or_default().clone();
            let (halt, halted) = watch::channel(false);
            let task = tokio::spawn(run(src.clone(), files, intake.clone(), halted, events.clone()));
            running.push((src, halt, task));
        }
        tokio::select! {
            r = cfg.changed() => if r.is_err() { break },
            _ = stop.changed() => break,
        }
    }
    for (_, halt, task) in running {
        let _ = halt.send(true);
        let _ = task.await;
    }
}

/// Names that are still being written by the usual conventions (hidden temp file, `.part`, `.tmp`).
fn in_progress(name: &str) -> bool {
    name.starts_with('.') || name.ends_with(".part") || name.ends_with(".tmp") || name.ends_with(".crdownload")
}

/// The entries of `dir` to take, with their size and modification time, in name order. Folders
/// (done/ and failed/ among them) are passed over, and so are links to folders. A link is
/// followed: a link to a picture is a picture (the link moves to done/, what it names stays).
/// Anything else that is not a regular file (a FIFO, a socket, a device, a link to one of those
/// or to nothing) is taken too: reading it fails (`files::read_bounded` reads regular files
/// only), so it moves to failed/ with its reason instead of staying in the folder unreported.
fn list(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64, SystemTime)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let Ok(e) = e else { continue };
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if in_progress(name) {
            continue;
        }
        let path = e.path();
        // what a link names, else the entry itself (a link to nothing)
        let Ok(m) = std::fs::metadata(&path).or_else(|_| e.metadata()) else { continue };
        if !m.is_dir() {
            v.push((path, m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// Runs the source until `stop` turns true (or the intake closes). `taken` holds the folder's
/// files handed to the pipeline and not yet moved.
pub async fn run(src: FolderSource, taken: Taken, intake: mpsc::Sender<Job>, mut stop: watch::Receiver<bool>, events: EventSink) {
    let id: Arc<str> = Arc::from(src.id.as_str());
    let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
    let mut watcher: Option<notify::RecommendedWatcher> = None;
    let mut seen: HashMap<PathBuf, (u64, SystemTime, Instant)> = HashMap::new();
    let is_taken = |p: &PathBuf| taken.lock().unwrap_or_else(|e| e.into_inner()).contains(p);
    let mut missing_reported = false;
    for d in [&src.done_dir, &src.failed_dir] {
        if let Err(e) = std::fs::create_dir_all(d) {
            events.emit(EventBody::SourceError { source: id.to_string(), path: d.to_string_lossy().into_owned(), error: e.to_string() });
        }
    }
    loop {
        if *stop.borrow() {
            return;
        }
        if watcher.is_none() && src.path.is_dir() {
            let tx = wake_tx.clone();
            let w = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
                let _ = tx.try_send(());
            })
            .and_then(|mut w| w.watch(&src.path, notify::RecursiveMode::NonRecursive).map(|_| w));
            match w {
                Ok(w) => watcher = Some(w),
                Err(e) => tracing::warn!(source = %id, "cannot watch {}: {e}; polling", src.path.display()),
            }
        }
        let listing = {
            let p = src.path.clone();
            tokio::task::spawn_blocking(move || list(&p)).await.unwrap_or_else(|e| Err(std::io::Error::other(e)))
        };
        let mut pending = false;
        match listing {
            Err(e) => {
                watcher = None;
                if !missing_reported {
                    missing_reported = true;
                    let path = src.path.to_string_lossy().into_owned();
                    events.emit(EventBody::SourceError { source: id.to_string(), path, error: e.to_string() });
                }
            }
            Ok(files) => {
                if missing_reported {
                    missing_reported = false;
                    events.emit(EventBody::SourceRecovered { source: id.to_string(), path: src.path.to_string_lossy().into_owned() });
                }
                let present: HashSet<&PathBuf> = files.iter().map(|f| &f.0).collect();
                taken.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| present.contains(p));
                seen.retain(|p, _| present.contains(p));
                for (path, len, mtime) in &files {
                    if is_taken(path) {
                        continue;
                    }
                    let stable = match seen.get(path) {
                        Some(&(l, m, since)) if l == *len && m == *mtime => since.elapsed() >= src.settle,
                        _ => {
                            seen.insert(path.clone(), (*len, *mtime, Instant::now()));
                            src.settle.is_zero()
                        }
                    };
                    if !stable {
                        pending = true;
                        continue;
                    }
                    let job = Job {
                        source: id.clone(),
                        image: ImageRef::Path(path.clone()),
                        data: JobData::File(path.clone()),
                        completion: Completion::File {
                            path: path.clone(),
                            done_dir: src.done_dir.clone(),
                            failed_dir: src.failed_dir.clone(),
                        },
                    };
                    tokio::select! {
                        r = intake.send(job) => if r.is_err() { return },
                        _ = stop.changed() => return,
                    }
                    seen.remove(path);
                    taken.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone());
                }
            }
        }
        let wait = if pending { src.settle.min(src.scan_interval).max(Duration::from_millis(10)) } else { src.scan_interval };
        tokio::select! {
            _ = wake_rx.recv() => {
                // let a burst of events coalesce
                tokio::time::sleep(Duration::from_millis(5)).await;
                while wake_rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}
