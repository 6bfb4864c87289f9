//! Host memory and the limits on it: how much of the machine's RAM this process may still take
//! before the kernel reclaims, throttles or OOM-kills it, and which limit says so.
//!
//! Sources, all under a [`SysRoot`] (production: `/proc` and `/sys/fs/cgroup`; tests: a folder of
//! fixture files):
//! - `/proc/meminfo`: `MemTotal`, and `MemAvailable` (`MemFree` on kernels without it), which
//!   counts reclaimable page cache as available (on a Jetson `MemFree` is far below it). Swap is
//!   never counted: a model's tensors that land in swap are as good as lost.
//! - `/proc/self/cgroup`: this process's cgroup. With a cgroup v1 `memory` controller line, the
//!   v1 hierarchy at `sys/fs/cgroup/memory` (`memory.limit_in_bytes`, `memory.usage_in_bytes`);
//!   otherwise the cgroup v2 line `0::` and the unified hierarchy at `sys/fs/cgroup`
//!   (`memory.max`, `memory.high`, `memory.current`). Every cgroup from the process's own up to
//!   the mount's root is read, since a parent's limit binds its children too.
//! - `/proc/self/mountinfo`: which cgroup the memory mount shows at its root (a container
//!   without its own cgroup namespace has its own cgroup, `/docker/<id>`, mounted as the root);
//!   the process's path is followed below it. A path that is still not under the mount (no
//!   mountinfo) falls back to the mount's root, read as the process's own cgroup.
//! - Usage is the cgroup's working set: its usage minus inactive file cache (`memory.stat`
//!   `inactive_file`, v1 `total_inactive_file`), which the kernel reclaims before it OOM-kills.
//!   A limit's headroom is the limit minus that usage; the tightest headroom wins.
//! - Not counted: v1 `memory.soft_limit_in_bytes` (a reclaim priority under global pressure,
//!   never a cap: neither throttling nor OOM follows from crossing it), `memory.swap.*` and v1
//!   `memory.memsw.*` (swap).
//!
//! [`device_memory_at`] turns these into one [`DeviceMemory`] for any device: the CPU and an
//! integrated GPU (which shares host RAM) take host memory capped by the cgroups; a discrete
//! GPU's own memory is what its driver reports (the cgroup does not limit device memory).
//!
//! May use: the standard library, serde, thiserror and `crate::files` (bounded reads). Files are read with a size bound and
//! their contents are never trusted: anything unexpected is a [`HostMemError`], never a panic.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Largest file read (meminfo, memory.stat and /proc/self/cgroup are a few KiB).
const MAX_FILE_BYTES: u64 = 256 << 10;

/// cgroup v1 reports "no limit" as a huge page-aligned number (close to i64::MAX).
const V1_NO_LIMIT: u64 = 1 << 62;

/// Why host memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostMemError {
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} has no field {field}")]
    Missing { path: PathBuf, field: &'static str },
    #[error("{path}: cannot read {what} from {text:?}")]
    Parse { path: PathBuf, what: &'static str, text: String },
}

/// Where the host's memory files are: `/proc` and `/sys/fs/cgroup` on a real box, a fixture
/// tree in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoot {
    pub proc: PathBuf,
    pub sys_fs_cgroup: PathBuf,
}

impl SysRoot {
    /// This machine: `/proc` and `/sys/fs/cgroup`.
    pub fn host() -> Self {
        Self::under(Path::new("/"))
    }

    /// `proc` and `sys/fs/cgroup` under `root`.
    pub fn under(root: &Path) -> Self {
        Self { proc: root.join("proc"), sys_fs_cgroup: root.join("sys/fs/cgroup") }
    }
}

/// Which device a memory figure is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// `cuMemGetInfo` of a discrete GPU.
    CudaDriver,
    /// An integrated GPU sharing host memory: MemAvailable, capped by the cgroup limits.
    IntegratedMeminfo,
    /// The CPU device: MemAvailable, capped by the cgroup limits.
    HostMeminfo,
}

impl MemorySource {
    /// Whether the device's memory is the host's (the CPU, an integrated GPU): there a pass that
    /// does not fit is the kernel's OOM killer rather than an out-of-memory error, and the
    /// pipeline's pictures take the same memory as the pass.
    pub fn is_host_memory(self) -> bool {
        self != Self::CudaDriver
    }
}

/// The limit that set a free-memory figure: the tightest of all that were read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// The free memory a discrete GPU's driver reports.
    Driver,
    /// A `/proc/meminfo` field (`MemAvailable`, or `MemFree` where the kernel has no MemAvailable).
    Meminfo(&'static str),
    /// A cgroup's limit file minus the cgroup's working set.
    Cgroup { path: String, file: &'static str },
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Driver => f.write_str("cuda:cuMemGetInfo free"),
            Self::Meminfo(field) => write!(f, "meminfo:{field}"),
            Self::Cgroup { path, file } => write!(f, "cgroup:{path} {file}"),
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Free and total memory of a device in bytes, and what bounds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// What this process may still take: the tightest headroom of all limits read.
    pub free: u64,
    /// The device's memory, or the tightest limit where one is below it.
    pub total: u64,
    pub source: MemorySource,
    /// The limit that set `free`.
    pub limit: Limit,
}

/// What the device driver says, for [`device_memory_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceReport {
    /// The CPU: host memory.
    Cpu,
    /// A GPU that shares host memory (Jetson): host memory, whatever the driver says.
    IntegratedGpu,
    /// A GPU with its own memory, as its driver reports it.
    DiscreteGpu { free: u64, total: u64 },
}

/// The memory a device has for this process, from what the box reports under `root`: the CPU
/// and an integrated GPU get host memory capped by every cgroup limit above this process; a
/// discrete GPU its driver's figures.
pub fn device_memory_at(root: &SysRoot, device: DeviceReport) -> Result<DeviceMemory, HostMemError> {
    let source = match device {
        DeviceReport::DiscreteGpu { free, total } => {
            return Ok(DeviceMemory { free, total, source: MemorySource::CudaDriver, limit: Limit::Driver })
        }
        DeviceReport::Cpu => MemorySource::HostMeminfo,
        DeviceReport::IntegratedGpu => MemorySource::IntegratedMeminfo,
    };
    let host = host_memory_at(root)?;
    Ok(DeviceMemory { free: host.free, total: host.total, source, limit: host.limit })
}

/// Host memory this process may still take, the machine's (or the tightest limit's) total, and
/// the limit that binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMemory {
    pub free: u64,
    pub total: u64,
    pub limit: Limit,
}

/// [`HostMemory`] from `/proc/meminfo` and every cgroup limit above this process.
pub fn host_memory_at(root: &SysRoot) -> Result<HostMemory, HostMemError> {
    let meminfo = Meminfo::read(root)?;
    let mut mem = HostMemory { free: meminfo.available, total: meminfo.total, limit: Limit::Meminfo(meminfo.available_field) };
    for c in cgroup_limits(root)? {
        mem.total = mem.total.min(c.limit);
        let headroom = c.headroom();
        if headroom < mem.free {
            mem.free = headroom;
            mem.limit = Limit::Cgroup { path: c.path, file: c.file };
        }
    }
    Ok(mem)
}

/// The `/proc/meminfo` figures the budget uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meminfo {
    pub total: u64,
    /// `MemAvailable`, or `MemFree` on kernels without it.
    pub available: u64,
    pub available_field: &'static str,
}

impl Meminfo {
    pub fn read(root: &SysRoot) -> Result<Self, HostMemError> {
        let path = root.proc.join("meminfo");
        let text = read_bounded(&path)?;
        let total = meminfo_field(&text, "MemTotal").ok_or(HostMemError::Missing { path: path.clone(), field: "MemTotal" })?;
        let (available, available_field) = match meminfo_field(&text, "MemAvailable") {
            Some(v) => (v, "MemAvailable"),
            None => (meminfo_field(&text, "MemFree").ok_or(HostMemError::Missing { path, field: "MemAvailable" })?, "MemFree"),
        };
        Ok(Self { total, available, available_field })
    }
}

/// One cgroup limit above this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimit {
    /// The cgroup's path as `/proc/self/cgroup` names it (`/system.slice/yolo-edge.service`).
    pub path: String,
    /// The limit's file (`memory.max`, `memory.high`, `memory.limit_in_bytes`).
    pub file: &'static str,
    /// The limit (bytes).
    pub limit: u64,
    /// The cgroup's working set: usage minus inactive file cache (bytes).
    pub used: u64,
}

impl CgroupLimit {
    /// What is left under this limit (bytes).
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// The two cgroup hierarchies' memory files.
#[derive(Debug, Clone, Copy)]
struct Files {
    v1: bool,
    limits: &'static [&'static str],
    usage: &'static str,
    inactive_file: &'static str,
}

const V2: Files = Files { v1: false, limits: &["memory.max", "memory.high"], usage: "memory.current", inactive_file: "inactive_file" };
const V1: Files =
    Files { v1: true, limits: &["memory.limit_in_bytes"], usage: "memory.usage_in_bytes", inactive_file: "total_inactive_file" };

/// Every memory limit set on this process's cgroup and its ancestors (empty: none, or no cgroup
/// memory controller).
pub fn cgroup_limits(root: &SysRoot) -> Result<Vec<CgroupLimit>, HostMemError> {
    let path = root.proc.join("self/cgroup");
    let text = match read_bounded(&path) {
        Ok(t) => t,
        Err(HostMemError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let (mount, cgroup, files) = match membership(&text) {
        Some(Membership::V1(p)) => (root.sys_fs_cgroup.join("memory"), p, V1),
        Some(Membership::V2(p)) => (root.sys_fs_cgroup.clone(), p, V2),
        None => return Ok(Vec::new()),
    };
    if !mount.is_dir() {
        return Ok(Vec::new());
    }
    let mountinfo = read_optional(&root.proc.join("self/mountinfo"))?;
    let mount_root = mountinfo.as_deref().and_then(|m| mount_root_of(m, files.v1));
    let mut out = Vec::new();
    for (dir, name) in ancestry(&mount, mount_root.as_deref(), cgroup) {
        out.extend(limits_in(&dir, &name, files)?);
    }
    Ok(out)
}

/// This process's memory cgroup from `/proc/self/cgroup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership<'a> {
    /// A cgroup v1 hierarchy with the `memory` controller.
    V1(&'a str),
    /// The cgroup v2 unified hierarchy (`0::`).
    V2(&'a str),
}

/// Picks the memory controller's line: v1 `N:...memory...:/path` wins over the v2 `0::/path`
/// (on a hybrid box the memory controller is on v1).
fn membership(text: &str) -> Option<Membership<'_>> {
    let mut v2 = None;
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else { continue };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(Membership::V1(path));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(Membership::V2(path));
        }
    }
    v2
}

/// The cgroup a memory cgroup mount shows as its root, from `/proc/self/mountinfo` (field 4 of
/// the `cgroup` mount with the `memory` option for v1, of the `cgroup2` mount for v2): `/` on a
/// host, the container's own cgroup (`/docker/<id>`) in a container without a cgroup namespace.
fn mount_root_of(mountinfo: &str, v1: bool) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split_whitespace();
        let (fstype, _source, options) = (fs.next()?, fs.next()?, fs.next().unwrap_or(""));
        let memory = if v1 { fstype == "cgroup" && options.split(',').any(|o| o == "memory") } else { fstype == "cgroup2" };
        memory.then(|| mount.split_whitespace().nth(3).map(str::to_string)).flatten()
    })
}

/// The folders of `cgroup` and its ancestors under `mount`, each with its cgroup path, from the
/// process's own cgroup up to the mount's root. `mount_root` is the cgroup the mount shows at its
/// root (`/` where unknown). A path that is not a folder under the mount (or that is not a plain
/// absolute path) is the process's cgroup mounted as the root itself.
fn ancestry(mount: &Path, mount_root: Option<&str>, cgroup: &str) -> Vec<(PathBuf, String)> {
    let split = |p: &str| -> Vec<String> { p.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect() };
    let plain = |p: &str, parts: &[String]| p.starts_with('/') && parts.iter().all(|c| c != "." && c != "..");
    let parts = split(cgroup);
    // the components of the mount's root cgroup, where they lead the process's path
    let root = match mount_root {
        Some(m) if plain(m, &split(m)) && parts.starts_with(&split(m)) => split(m),
        _ => Vec::new(),
    };
    let own = mount.join(parts[root.len()..].join("/"));
    if !plain(cgroup, &parts) || !own.is_dir() {
        return vec![(mount.to_path_buf(), cgroup.to_string())];
    }
    (root.len()..=parts.len()).rev().map(|n| (mount.join(parts[root.len()..n].join("/")), format!("/{}", parts[..n].join("/")))).collect()
}

/// The limits set in one cgroup folder.
fn limits_in(dir: &Path, name: &str, files: Files) -> Result<Vec<CgroupLimit>, HostMemError> {
    let mut set = Vec::new();
    for &file in files.limits {
        let path = dir.join(file);
        let Some(text) = read_optional(&path)? else { continue };
        let t = text.trim();
        if t == "max" {
            continue;
        }
        let v: u64 = t.parse().map_err(|_| HostMemError::Parse { path, what: "a limit", text: t.chars().take(64).collect() })?;
        if v < V1_NO_LIMIT {
            set.push((file, v));
        }
    }
    if set.is_empty() {
        return Ok(Vec::new());
    }
    let used = working_set(dir, files)?;
    Ok(set.into_iter().map(|(file, limit)| CgroupLimit { path: name.to_string(), file, limit, used }).collect())
}

/// A cgroup's usage minus its inactive file cache (which the kernel reclaims before OOM).
fn working_set(dir: &Path, files: Files) -> Result<u64, HostMemError> {
    let path = dir.join(files.usage);
    let text = read_optional(&path)?.ok_or(HostMemError::Missing { path: path.clone(), field: files.usage })?;
    let t = text.trim();
    let usage: u64 = t.parse().map_err(|_| HostMemError::Parse { path, what: "a usage", text: t.chars().take(64).collect() })?;
    let inactive = read_optional(&dir.join("memory.stat"))?.and_then(|s| stat_field(&s, files.inactive_file)).unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// A `memory.stat` field (`name value` lines, bytes).
fn stat_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == field).then_some(())?;
        it.next()?.parse().ok()
    })
}

/// Parses a `/proc/meminfo` field (kB) into bytes; `None` when absent or not a number.
pub fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") => v.checked_mul(1024),
            _ => Some(v),
        }
    })
}

/// Reads a small file whole, refusing one larger than [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> Result<String, HostMemError> {
    let buf = crate::files::read_bounded(path, MAX_FILE_BYTES).map_err(|source| match source.kind() {
        std::io::ErrorKind::InvalidData => HostMemError::TooLarge { path: path.to_path_buf() },
        _ => HostMemError::Io { path: path.to_path_buf(), source },
    })?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// [`read_bounded`], with a missing file as `None`.
fn read_optional(path: &Path) -> Result<Option<String>, HostMemError> {
    match read_bounded(path) {
        Ok(t) => Ok(Some(t)),
        Err(HostMemError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Gives the free pages of the C allocator's heaps back to the kernel (glibc's `malloc_trim`;
/// a no-op elsewhere). Memory freed by threads that have ended (a camera's old pipeline) stays
/// resident in their allocator arenas otherwise, and the resident set is what a cgroup limit
/// and the OOM killer judge. Costs a walk of the free lists: call it after teardowns and on a
/// slow timer, not per frame.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it touches no live
    // allocation and is thread-safe in glibc.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixture trees for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::{Path, PathBuf};

    /// Under `root`: a 16 GiB host with 8 GiB available whose process runs in a systemd service
    /// capped at 3 GiB (`memory.max`) with 1 GiB in use. Returns the service's cgroup folder, whose
    /// files a test may rewrite.
    pub(crate) fn capped_service(root: &Path) -> PathBuf {
        let g = 1u64 << 30;
        let svc = root.join("sys/fs/cgroup/system.slice/yolo-edge.service");
        std::fs::create_dir_all(&svc).unwrap();
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::write(root.join("proc/meminfo"), "MemTotal: 16777216 kB\nMemFree: 524288 kB\nMemAvailable: 8388608 kB\n").unwrap();
        std::fs::write(root.join("proc/self/cgroup"), "0::/system.slice/yolo-edge.service\n").unwrap();
        std::fs::write(svc.join("memory.max"), (3 * g).to_string()).unwrap();
        std::fs::write(svc.join("memory.current"), g.to_string()).unwrap();
        svc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const KIB: u64 = 1024;

    /// A fixture tree of (path under the root, contents) files.
    fn tree(parts: Vec<Vec<(String, String)>>) -> (tempfile::TempDir, SysRoot) {
        let dir = tempfile::tempdir().unwrap();
        for (p, text) in parts.into_iter().flatten() {
            let path = dir.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let root = SysRoot::under(dir.path());
        (dir, root)
    }

    /// A `/proc/meminfo` with these kB figures (and 8 GiB of free swap, which must not count).
    fn meminfo(total_kb: u64, free_kb: u64, available_kb: u64) -> Vec<(String, String)> {
        let text = format!(
            "MemTotal:       {total_kb} kB\nMemFree:        {free_kb} kB\nMemAvailable:   {available_kb} kB\n\
             Buffers:           1024 kB\nCached:         {} kB\nSwapTotal:      8388608 kB\nSwapFree:       8388608 kB\n\
             HugePages_Total:       0\n",
            available_kb.saturating_sub(free_kb)
        );
        vec![("proc/meminfo".into(), text)]
    }

    /// `/proc/self/cgroup`.
    fn self_cgroup(text: &str) -> Vec<(String, String)> {
        vec![("proc/self/cgroup".into(), text.into())]
    }

    /// Files of one cgroup folder.
    fn cgroup(path: &str, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(f, v)| (format!("{path}/{f}"), v.to_string())).collect()
    }

    fn gib_kb(g: u64) -> u64 {
        g * GIB / KIB
    }

    #[test]
    fn jetson_meminfo_budget_follows_mem_available_not_mem_free() {
        // 16 GiB board: 300 MiB MemFree, 9 GiB MemAvailable (the rest page cache); no cgroup file
        let (_d, root) = tree(vec![meminfo(gib_kb(16), 300 * 1024, gib_kb(9))]);
        let m = device_memory_at(&root, DeviceReport::IntegratedGpu).unwrap();
        assert_eq!(m.free, 9 * GIB);
        assert_eq!(m.total, 16 * GIB);
        assert_eq!(m.source, MemorySource::IntegratedMeminfo);
        assert_eq!(m.limit, Limit::Meminfo("MemAvailable"));
        assert_eq!(m.limit.to_string(), "meminfo:MemAvailable");
    }

    #[test]
    fn systemd_service_memory_max_leaves_limit_minus_current() {
        let (_d, root) = tree(vec![
            meminfo(gib_kb(32), gib_kb(20), gib_kb(24)),
            self_cgroup("0::/system.slice/yolo-edge.service\n"),
            cgroup("sys/fs/cgroup", &[("cgroup.controllers", "cpu memory pids\n"), ("memory.current", &(9 * GIB).to_string())]),
            cgroup(
                "sys/fs/cgroup/system.slice",
                &[("memory.max", "max\n"), ("memory.high", "max\n"), ("memory.current", &(5 * GIB).to_string())],
            ),
            cgroup(
                "sys/fs/cgroup/system.slice/yolo-edge.service",
                &[("memory.max", &(3 * GIB).to_string()), ("memory.high", "max\n"), ("memory.current", &GIB.to_string())],
            ),
        ]);
        let m = device_memory_at(&root, DeviceReport::Cpu).unwrap();
        assert_eq!(m.free, 2 * GIB);
        assert_eq!(m.total, 3 * GIB);
        assert_eq!(m.source, MemorySource::HostMeminfo);
        assert_eq!(m.limit.to_string(), "cgroup:/system.slice/yolo-edge.service memory.max");
    }

    #[test]
    fn a_tighter_parent_limit_binds() {
        // the service may have 3 GiB, but its slice is capped at 4 GiB with 3.5 GiB in use
        let (_d, root) = tree(vec![
            meminfo(gib_kb(32), gib_kb(20), gib_kb(24)),
            self_cgroup("0::/edge.slice/yolo-edge.service\n"),
            cgroup("sys/fs/cgroup/edge.slice", &[("memory.max", &(4 * GIB).to_string()), ("memory.current", &(7 * GIB / 2).to_string())]),
            cgroup(
                "sys/fs/cgroup/edge.slice/yolo-edge.service",
                &[("memory.max", &(3 * GIB).to_string()), ("memory.current", &GIB.to_string())],
            ),
        ]);
        let m = host_memory_at(&root).unwrap();
        assert_eq!(m.free, GIB / 2);
        assert_eq!(m.total, 3 * GIB);
        assert_eq!(m.limit, Limit::Cgroup { path: "/edge.slice".into(), file: "memory.max" });
        let all = cgroup_limits(&root).unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].path, "/edge.slice/yolo-edge.service");
        assert_eq!(all[1].headroom(), GIB / 2);
    }

    #[test]
    fn memory_high_binds_below_memory_max() {
        let (_d, root) = tree(vec![
            meminfo(gib_kb(32), gib_kb(20), gib_kb(24)),
            self_cgroup("0::/system.slice/yolo-edge.service\n"),
            cgroup(
                "sys/fs/cgroup/system.slice/yolo-edge.service",
                &[("memory.max", &(6 * GIB).to_string()), ("memory.high", &(4 * GIB).to_string()), ("memory.current", &GIB.to_string())],
            ),
        ]);
        let m = host_memory_at(&root).unwrap();
        assert_eq!(m.free, 3 * GIB);
        assert_eq!(m.total, 4 * GIB);
        assert_eq!(m.limit.to_string(), "cgroup:/system.slice/yolo-edge.service memory.high");
    }

    #[test]
    fn v1_docker_without_cgroup_namespace_reads_the_mount_root() {
        // /docker/x is the container's cgroup as the host names it; inside, it is the mount root
        let (_d, root) = tree(vec![
            meminfo(gib_kb(64), gib_kb(40), gib_kb(50)),
            self_cgroup("12:pids:/docker/x\n11:memory:/docker/x\n1:name=systemd:/docker/x\n0::/system.slice/containerd.service\n"),
            cgroup(
                "sys/fs/cgroup/memory",
                &[
                    ("memory.limit_in_bytes", &(2 * GIB).to_string()),
                    ("memory.soft_limit_in_bytes", &(GIB / 4).to_string()),
                    ("memory.memsw.limit_in_bytes", &(4 * GIB).to_string()),
                    ("memory.usage_in_bytes", &(GIB / 2 + GIB / 4).to_string()),
                    ("memory.stat", format!("cache 268435456\ntotal_inactive_file {}\ntotal_rss 536870912\n", GIB / 4).as_str()),
                ],
            ),
        ]);
        let m = host_memory_at(&root).unwrap();
        // 2 GiB - (768 MiB usage - 256 MiB inactive file); the soft limit and memsw do not count
        assert_eq!(m.free, 2 * GIB - GIB / 2);
        assert_eq!(m.total, 2 * GIB);
        assert_eq!(m.limit.to_string(), "cgroup:/docker/x memory.limit_in_bytes");
    }

    #[test]
    fn v1_container_mount_root_from_mountinfo_walks_below_it() {
        // systemd inside a v1 container without a cgroup namespace: the mount's root is
        // /docker/x (mountinfo field 4), the service's cgroup is below it and has the tighter limit
        let (_d, root) = tree(vec![
            meminfo(gib_kb(64), gib_kb(40), gib_kb(50)),
            self_cgroup("11:memory:/docker/x/system.slice/yolo-edge.service\n0::/docker/x/system.slice/yolo-edge.service\n"),
            vec![(
                "proc/self/mountinfo".into(),
                "731 730 0:59 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                 735 731 0:32 /docker/x /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:15 - cgroup cgroup rw,memory\n"
                    .into(),
            )],
            cgroup(
                "sys/fs/cgroup/memory",
                &[("memory.limit_in_bytes", &(8 * GIB).to_string()), ("memory.usage_in_bytes", &(2 * GIB).to_string())],
            ),
            cgroup(
                "sys/fs/cgroup/memory/system.slice",
                &[("memory.limit_in_bytes", "9223372036854771712\n"), ("memory.usage_in_bytes", &GIB.to_string())],
            ),
            cgroup(
                "sys/fs/cgroup/memory/system.slice/yolo-edge.service",
                &[("memory.limit_in_bytes", &(3 * GIB).to_string()), ("memory.usage_in_bytes", &(GIB / 2).to_string())],
            ),
        ]);
        let all = cgroup_limits(&root).unwrap();
        let named: Vec<(&str, u64)> = all.iter().map(|c| (c.path.as_str(), c.headroom())).collect();
        assert_eq!(named, [("/docker/x/system.slice/yolo-edge.service", 5 * GIB / 2), ("/docker/x", 6 * GIB)]);
        let m = host_memory_at(&root).unwrap();
        assert_eq!((m.free, m.total), (5 * GIB / 2, 3 * GIB));
        assert_eq!(m.limit.to_string(), "cgroup:/docker/x/system.slice/yolo-edge.service memory.limit_in_bytes");
    }

    #[test]
    fn v1_path_under_the_mount_walks_its_ancestors() {
        let (_d, root) = tree(vec![
            meminfo(gib_kb(64), gib_kb(40), gib_kb(50)),
            self_cgroup("4:memory:/docker/x\n"),
            cgroup("sys/fs/cgroup/memory", &[("memory.limit_in_bytes", "9223372036854771712\n"), ("memory.usage_in_bytes", "1\n")]),
            cgroup(
                "sys/fs/cgroup/memory/docker",
                &[("memory.limit_in_bytes", &(3 * GIB).to_string()), ("memory.usage_in_bytes", &(2 * GIB).to_string())],
            ),
            cgroup(
                "sys/fs/cgroup/memory/docker/x",
                &[("memory.limit_in_bytes", &(2 * GIB).to_string()), ("memory.usage_in_bytes", &GIB.to_string())],
            ),
        ]);
        let m = host_memory_at(&root).unwrap();
        // both leave 1 GiB: the first one found (the process's own) is reported
        assert_eq!(m.free, GIB);
        assert_eq!(m.limit.to_string(), "cgroup:/docker/x memory.limit_in_bytes");
        assert_eq!(cgroup_limits(&root).unwrap().len(), 2);
    }

    #[test]
    fn max_everywhere_is_no_limit() {
        let (_d, root) = tree(vec![
            meminfo(gib_kb(8), gib_kb(1), gib_kb(5)),
            self_cgroup("0::/user.slice/user-1000.slice/session-1.scope\n"),
            cgroup("sys/fs/cgroup/user.slice", &[("memory.max", "max\n"), ("memory.high", "max\n"), ("memory.current", "1000\n")]),
            cgroup("sys/fs/cgroup/user.slice/user-1000.slice", &[("memory.max", "max\n"), ("memory.current", "1000\n")]),
            cgroup("sys/fs/cgroup/user.slice/user-1000.slice/session-1.scope", &[("memory.max", "max\n"), ("memory.current", "1000\n")]),
        ]);
        assert!(cgroup_limits(&root).unwrap().is_empty());
        let m = host_memory_at(&root).unwrap();
        assert_eq!((m.free, m.total), (5 * GIB, 8 * GIB));
        assert_eq!(m.limit, Limit::Meminfo("MemAvailable"));
    }

    #[test]
    fn integrated_gpu_in_a_container_is_capped_by_the_cgroup() {
        // a container with its own cgroup namespace: `0::/`, its limit at the mount root
        let (_d, root) = tree(vec![
            meminfo(gib_kb(32), gib_kb(2), gib_kb(28)),
            self_cgroup("0::/\n"),
            cgroup(
                "sys/fs/cgroup",
                &[
                    ("cgroup.controllers", "cpu memory\n"),
                    ("memory.max", &(6 * GIB).to_string()),
                    ("memory.current", &(5 * GIB / 2).to_string()),
                    ("memory.stat", format!("anon 1610612736\nfile 1073741824\ninactive_file {}\n", GIB / 2).as_str()),
                ],
            ),
        ]);
        let m = device_memory_at(&root, DeviceReport::IntegratedGpu).unwrap();
        // 6 GiB - (2.5 GiB - 0.5 GiB inactive file)
        assert_eq!(m.free, 4 * GIB);
        assert_eq!(m.total, 6 * GIB);
        assert_eq!(m.source, MemorySource::IntegratedMeminfo);
        assert_eq!(m.limit.to_string(), "cgroup:/ memory.max");
        // the CPU device in the same box: the same figures
        let cpu = device_memory_at(&root, DeviceReport::Cpu).unwrap();
        assert_eq!((cpu.free, cpu.total, &cpu.limit), (m.free, m.total, &m.limit));
        // a discrete GPU's own memory is not the cgroup's to limit
        let gpu = device_memory_at(&root, DeviceReport::DiscreteGpu { free: 20 * GIB, total: 24 * GIB }).unwrap();
        assert_eq!((gpu.free, gpu.total, gpu.source, gpu.limit), (20 * GIB, 24 * GIB, MemorySource::CudaDriver, Limit::Driver));
    }

    #[test]
    fn swap_is_not_counted() {
        // 8 GiB of free swap in meminfo, swap allowed in the cgroup: neither adds to the budget
        let (_d, root) = tree(vec![
            meminfo(gib_kb(4), gib_kb(1), gib_kb(2)),
            self_cgroup("0::/yolo.scope\n"),
            cgroup(
                "sys/fs/cgroup/yolo.scope",
                &[
                    ("memory.max", &(3 * GIB).to_string()),
                    ("memory.current", &(GIB / 2).to_string()),
                    ("memory.swap.max", "max\n"),
                    ("memory.swap.current", &GIB.to_string()),
                ],
            ),
        ]);
        let m = host_memory_at(&root).unwrap();
        assert_eq!(m.free, 2 * GIB);
        assert_eq!(m.total, 3 * GIB);
        assert_eq!(m.limit, Limit::Meminfo("MemAvailable"));
    }

    #[test]
    fn odd_contents_are_errors_not_panics() {
        let base = || vec![meminfo(gib_kb(4), gib_kb(1), gib_kb(2)), self_cgroup("0::/a\n")];
        let mut bad_limit = base();
        bad_limit.push(cgroup("sys/fs/cgroup/a", &[("memory.max", "lots\n"), ("memory.current", "1\n")]));
        let (_d, root) = tree(bad_limit);
        assert!(matches!(host_memory_at(&root), Err(HostMemError::Parse { what: "a limit", .. })));

        let mut no_usage = base();
        no_usage.push(cgroup("sys/fs/cgroup/a", &[("memory.max", "1073741824\n")]));
        let (_d, root) = tree(no_usage);
        assert!(matches!(host_memory_at(&root), Err(HostMemError::Missing { field: "memory.current", .. })));

        let (_d, root) = tree(vec![vec![("proc/meminfo".into(), "MemTotal: 18446744073709551615 kB\nMemAvailable: x kB\n".into())]]);
        assert!(matches!(host_memory_at(&root), Err(HostMemError::Missing { field: "MemTotal", .. })));

        let (_d, root) = tree(vec![vec![("proc/meminfo".into(), "x".repeat(MAX_FILE_BYTES as usize + 1))]]);
        assert!(matches!(host_memory_at(&root), Err(HostMemError::TooLarge { .. })));

        // a path that climbs out of the mount is read as the mount root
        let mut climbing = base();
        climbing[1] = self_cgroup("0::/../../etc\n");
        climbing.push(cgroup("sys/fs/cgroup", &[("memory.max", &GIB.to_string()), ("memory.current", "0\n")]));
        let (_d, root) = tree(climbing);
        let m = host_memory_at(&root).unwrap();
        assert_eq!((m.free, m.limit.to_string()), (GIB, "cgroup:/../../etc memory.max".to_string()));
    }

    #[test]
    fn meminfo_without_mem_available_uses_mem_free() {
        let (_d, root) = tree(vec![vec![("proc/meminfo".into(), "MemTotal: 4194304 kB\nMemFree: 1048576 kB\n".into())]]);
        let m = host_memory_at(&root).unwrap();
        assert_eq!((m.free, m.total, m.limit), (GIB, 4 * GIB, Limit::Meminfo("MemFree")));
    }

    #[test]
    fn parses_meminfo_fields() {
        let t = "MemTotal:       16314516 kB\nMemFree:         1234 kB\nMemAvailable:    8000000 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(16314516 * 1024));
        assert_eq!(meminfo_field(t, "MemAvailable"), Some(8_000_000 * 1024));
        assert_eq!(meminfo_field(t, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_field(t, "Mem"), None);
        assert_eq!(meminfo_field(t, "SwapTotal"), None);
    }

    #[test]
    fn this_machine_is_read() {
        let m = host_memory_at(&SysRoot::host()).unwrap();
        assert!(m.total > 0 && m.free <= m.total, "{m:?}");
    }
}
