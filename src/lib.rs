//! yolo-edge: a YOLOv9 edge runtime on candle.
//!
//! The modules are layered; each imports only from the layers below it (see
//! `docs/architecture.md` for the picture's path through them):
//!
//! | layer | modules | job |
//! |---|---|---|
//! | applications | [`agent`], [`demo`], [`eval`], [`bench`] | the MQTT agent, the one-command demo, mAP evaluation, benchmark reports |
//! | planning | [`planner`] | the batch size from device memory: memory model, probe, search, report |
//! | detection | [`detector`] | a loaded model with its batched pre- and post-processing |
//! | model | [`model`], [`weights`] | YOLOv9 itself, and the checkpoint formats it loads from |
//! | acceleration | [`backend`] | devices, memory, CPU and CUDA kernels, uploads, the arena |
//! | foundations | [`vision`], `media`, [`units`], [`env`], [`files`] | pictures on the host (decoding, letterbox, NMS, annotation); video through GStreamer (feature `gstreamer`); byte sizes; the process environment, read once; bounded reads of files named from outside |

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod agent;
pub mod backend;
pub mod bench;
pub mod demo;
pub mod detector;
pub mod env;
pub mod eval;
pub mod files;
#[cfg(feature = "gstreamer")]
pub mod media;
pub mod model;
pub mod planner;
pub mod units;
pub mod vision;
pub mod weights;

/// Held by the unit tests that read this process's own memory peak (`VmHWM`) and by those that
/// build whole models: the tests of one binary share a process, and a model built on one test
/// thread would otherwise inflate the peak another test measures.
#[cfg(test)]
pub(crate) fn process_memory_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The layering above, checked on the source: a module names only itself and the layers below
/// it (`crate::x` paths, comments included, so that docs do not point upward either).
#[cfg(test)]
mod layering {
    /// Each top-level module with the modules it may name.
    const ALLOWED: &[(&str, &[&str])] = &[
        ("units", &[]),
        ("env", &[]),
        ("files", &[]),
        ("vision", &["files"]),
        ("media", &[]),
        ("backend", &["vision", "units", "env", "files"]),
        ("weights", &["model", "backend", "vision", "units", "env", "files"]),
        ("model", &["weights", "backend", "vision", "units", "env", "files"]),
        ("detector", &["model", "weights", "backend", "vision", "units", "env", "files"]),
        ("planner", &["detector", "model", "weights", "backend", "vision", "units", "env", "files"]),
        ("bench", &["detector", "model", "weights", "backend", "vision", "units", "env", "files"]),
        ("eval", &["detector", "model", "weights", "backend", "vision", "media", "units", "env", "files"]),
        ("agent", &["media", "planner", "detector", "model", "weights", "backend", "vision", "units", "env", "files"]),
        ("demo", &["agent", "media", "eval", "planner", "detector", "model", "weights", "backend", "vision", "units", "env", "files"]),
    ];

    fn sources(path: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_dir() {
            for e in std::fs::read_dir(path).unwrap() {
                sources(&e.unwrap().path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
    }

    #[test]
    fn modules_import_only_downward() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut bad = Vec::new();
        for (module, allowed) in ALLOWED {
            let mut files = Vec::new();
            let dir = src.join(module);
            let root = if dir.is_dir() { dir } else { src.join(format!("{module}.rs")) };
            sources(&root, &mut files);
            assert!(!files.is_empty(), "no source for module {module}");
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                for (i, line) in text.lines().enumerate() {
                    for part in line.split("crate::").skip(1) {
                        let name: String = part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                        if name != *module && !allowed.contains(&name.as_str()) && ALLOWED.iter().any(|(m, _)| *m == name) {
                            bad.push(format!("{}:{}: {module} names {name}", f.display(), i + 1));
                        }
                    }
                }
            }
        }
        assert!(bad.is_empty(), "imports against the layering:\n{}", bad.join("\n"));
    }

    fn folders(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.push(format!("src/{}/", p.strip_prefix(root).unwrap().display()));
                folders(&p, root, out);
            }
        }
    }

    /// `docs/architecture.md` names every folder of `src/` and no folder that is gone.
    #[test]
    fn architecture_doc_matches_the_tree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
        let mut tree = Vec::new();
        folders(&root.join("src"), &root.join("src"), &mut tree);
        let missing: Vec<_> = tree.iter().filter(|f| !doc.contains(f.as_str())).collect();
        assert!(missing.is_empty(), "folders docs/architecture.md does not name: {missing:?}");
        let named: Vec<&str> = doc.split('`').filter(|w| w.starts_with("src/") && w.ends_with('/')).collect();
        let gone: Vec<_> = named.iter().filter(|w| !root.join(w).is_dir()).collect();
        assert!(gone.is_empty(), "docs/architecture.md names folders that do not exist: {gone:?}");
    }
}
