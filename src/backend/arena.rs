//! A device-memory arena for the activations of a pass: deterministic best-fit placement over one
//! reserved virtual address range, physical memory mapped on demand (CUDA virtual memory
//! management) and unmapped when trimmed.
//!
//! Why: CUDA's stream-ordered pool, which candle allocates from, reserved 1.12-1.22x the bytes a
//! pass's tensors held at once, in granules of up to 32 MiB, and with its default reuse policy
//! that reservation did not repeat: the same batch read 256, 320 and 352 MiB from the same
//! trimmed pool (yolov9e batch 3). Here every allocation of a pass lands at an
//! offset that depends only on the sequence of allocations and frees, which is the same for
//! every pass at one batch size, so the memory a batch needs is a number the planner can
//! measure once (measured: every reading repeated, 1.06-1.10x the tensors' bytes, and
//! the same budget held 5-12 % larger batches).
//!
//! How: a process-wide hook in cudarc (`scripts/patches/cudarc-alloc-hook.patch`, applied by
//! `scripts/build-cuda.sh`; cargo feature `arena`) asks this module before the pool. Only
//! threads inside [`serve`] are served (the detector's passes: model weights stay in the pool).
//! Frees are taken back in host order, which is safe because an arena serves one stream per
//! thread (candle's per-thread stream), exactly the reuse the pool itself allows on one stream.
//! `[tuning] allocator = "pool"` turns it off.
//!
//! CUDA graphs: a captured graph keeps the addresses its pass was given, so a capture
//! ([`serve_graph`]) allocates in a second region of the same size, which eager passes never
//! touch. Every graph of the process shares that region: graphs replay one at a time on the
//! inference thread's stream, each needing its memory only while it runs, so after a capture
//! the region's blocks are all taken back ([`release_graph_region`]) and the next capture lays
//! its pass over the same addresses. The region therefore holds the largest captured pass, not
//! the sum of them, and stays mapped while any graph lives ([`GraphHold`]).
//!
//! [`Placement`] is the allocator itself, host-side arithmetic only (tested on every machine).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Alignment of every block (bytes). cudaMalloc gives 256; cuDNN and the vectorised kernels
/// need at most that.
pub const ALIGN: u64 = 512;

/// Best-fit placement with coalescing over `capacity` bytes: the smallest free block that
/// fits, the lowest offset among blocks of that size, carved from its start.
#[derive(Debug, Clone)]
pub struct Placement {
    capacity: u64,
    /// offset -> length of each free block (coalesced: no two touch)
    free_at: BTreeMap<u64, u64>,
    /// (length, offset) of each free block
    free_by_len: BTreeSet<(u64, u64)>,
    /// offset -> length of each live block
    live: HashMap<u64, u64>,
    used: u64,
    used_high: u64,
    /// highest end of a live block since the last reset
    end_high: u64,
}

impl Placement {
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity / ALIGN * ALIGN;
        let mut p = Self {
            capacity,
            free_at: BTreeMap::new(),
            free_by_len: BTreeSet::new(),
            live: HashMap::new(),
            used: 0,
            used_high: 0,
            end_high: 0,
        };
        if capacity > 0 {
            p.insert_free(0, capacity);
        }
        p
    }

    fn insert_free(&mut self, off: u64, len: u64) {
        self.free_at.insert(off, len);
        self.free_by_len.insert((len, off));
    }

    fn remove_free(&mut self, off: u64, len: u64) {
        self.free_at.remove(&off);
        self.free_by_len.remove(&(len, off));
    }

    /// Places `bytes` (rounded up to [`ALIGN`]); `None` when no free block is large enough.
    /// Returns (offset, rounded length).
    pub fn alloc(&mut self, bytes: u64) -> Option<(u64, u64)> {
        let len = bytes.max(1).div_ceil(ALIGN) * ALIGN;
        let &(blen, boff) = self.free_by_len.range((len, 0)..).next()?;
        self.remove_free(boff, blen);
        if blen > len {
            self.insert_free(boff + len, blen - len);
        }
        self.live.insert(boff, len);
        self.used += len;
        self.used_high = self.used_high.max(self.used);
        self.end_high = self.end_high.max(boff + len);
        Some((boff, len))
    }

    /// Takes back the block at `off`, merging it with free neighbours; its length, or `None`
    /// if no live block starts there.
    pub fn free(&mut self, off: u64) -> Option<u64> {
        let len = self.live.remove(&off)?;
        self.used -= len;
        let (mut start, mut end) = (off, off + len);
        if let Some((&poff, &plen)) = self.free_at.range(..off).next_back() {
            if poff + plen == off {
                self.remove_free(poff, plen);
                start = poff;
            }
        }
        if let Some(&nlen) = self.free_at.get(&end) {
            self.remove_free(end, nlen);
            end += nlen;
        }
        self.insert_free(start, end - start);
        Some(len)
    }

    /// Whether no live block overlaps `[off, off + len)`.
    pub fn is_free(&self, off: u64, len: u64) -> bool {
        match self.free_at.range(..=off).next_back() {
            Some((&b, &blen)) => b + blen >= off + len,
            None => false,
        }
    }

    /// Bytes in live blocks now.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// High-water mark of [`used`](Self::used) since the last reset.
    pub fn used_high(&self) -> u64 {
        self.used_high
    }

    /// Highest end offset of a live block since the last reset: the span the pass needed.
    pub fn end_high(&self) -> u64 {
        self.end_high
    }

    /// Number of live blocks.
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }

    /// Highest end offset of a block live now.
    pub fn live_end(&self) -> u64 {
        self.live.iter().map(|(o, l)| o + l).max().unwrap_or(0)
    }

    /// Restarts the high-water marks from what is live now.
    pub fn reset_high(&mut self) {
        self.used_high = self.used;
        self.end_high = self.live_end();
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// An arena's figures (bytes): what its live blocks hold and what it has mapped from the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    pub used: u64,
    pub mapped: u64,
    pub used_high: u64,
    pub mapped_high: u64,
}

/// Whether the arena is wanted: feature `arena`, and `[tuning] allocator = "arena"` (the default)
/// (`pool` leaves every allocation to CUDA's pool, with stream-ordered reuse: `crate::backend::devmem`).
/// Read once, like the other knobs: [`serve`] asks on every batch.
pub fn wanted() -> bool {
    crate::backend::tuning::get().arena()
}

/// While alive, device allocations of this thread on `device` come from its arena (CUDA with the
/// `arena` feature; otherwise nothing happens). Nested guards are fine.
#[must_use = "the arena serves this thread only while the guard lives"]
pub struct Serving {
    #[cfg(feature = "arena")]
    prev: Option<vmm::Target>,
    #[cfg(feature = "arena")]
    active: bool,
}

/// The most address space an arena reserves (bytes; `u64::MAX`: the device's whole memory).
static RESERVATION_CAP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Caps the address space the arenas made from now on reserve: the agent's memory budget, so
/// that a board whose GPU shares 8 GiB of RAM with everything else does not see the agent
/// reserve all of it. Blocks that do not fit the cap come from the stream-ordered pool instead.
pub fn cap_reservation(bytes: u64) {
    RESERVATION_CAP.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// The size of an arena's reservation: the device's memory or the cap, whichever is smaller,
/// rounded up to whole granules.
pub fn reservation_size(device_total: u64, cap: u64, granule: u64) -> u64 {
    let granule = granule.max(1);
    device_total.min(cap).div_ceil(granule).saturating_mul(granule)
}

/// Lets the arena serve this thread's allocations on `device` until the guard drops.
pub fn serve(device: &candle_core::Device) -> Serving {
    #[cfg(feature = "arena")]
    {
        if let candle_core::Device::Cuda(d) = device {
            if wanted() {
                if let Some(idx) = vmm::arena_for(d) {
                    let prev = vmm::SERVING.with(|s| s.replace(Some(vmm::Target { idx, graph: false })));
                    return Serving { prev, active: true };
                }
            }
        }
        Serving { prev: None, active: false }
    }
    #[cfg(not(feature = "arena"))]
    {
        let _ = device;
        Serving {}
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        #[cfg(feature = "arena")]
        if self.active {
            vmm::SERVING.with(|s| s.set(self.prev));
        }
    }
}

/// While alive, this thread's allocations on `device` come from the arena's graph region (a CUDA
/// graph capture); where there is no arena they bypass it, so that a capture never takes
/// addresses that eager passes reuse (CUDA's graph memory pool then holds the pass).
pub fn serve_graph(device: &candle_core::Device) -> Serving {
    #[cfg(feature = "arena")]
    {
        let target = match device {
            candle_core::Device::Cuda(d) if wanted() => vmm::arena_for(d).map(|idx| vmm::Target { idx, graph: true }),
            _ => None,
        };
        let prev = vmm::SERVING.with(|s| s.replace(target));
        Serving { prev, active: true }
    }
    #[cfg(not(feature = "arena"))]
    {
        let _ = device;
        Serving {}
    }
}

/// Takes back every block of `device`'s graph region after a capture; returns how many were
/// live (the captured graph's own input and output buffers, and anything the pass kept, which
/// would be a bug: it would be overwritten by the next capture). `None` where there is no arena.
pub fn release_graph_region(device: &candle_core::Device) -> Option<usize> {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        return vmm::release_graph_region(d);
    }
    let _ = device;
    None
}

/// Gives the graph region's memory back to the device while no graph replays (a capture's warm
/// passes run eagerly beside it otherwise, needing the memory of both): what graphs replay over
/// is scratch, rewritten by every launch, so [`unpark_graph_region`] maps fresh memory at the
/// same addresses. Synchronises the device first. No graph may be launched in between.
pub fn park_graph_region(device: &candle_core::Device) -> Result<(), String> {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        return vmm::park_graph_region(d);
    }
    let _ = device;
    Ok(())
}

/// Maps again what [`park_graph_region`] gave back, where graphs still hold it. An error (out of
/// memory) leaves it unmapped: the caller must then drop every graph before launching one.
pub fn unpark_graph_region(device: &candle_core::Device) -> Result<(), String> {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        return vmm::unpark_graph_region(d);
    }
    let _ = device;
    Ok(())
}

/// Keeps `device`'s graph region mapped while alive (one per captured graph).
#[must_use = "the graph region may be unmapped once the hold drops"]
pub struct GraphHold {
    #[cfg(feature = "arena")]
    device: Option<candle_core::CudaDevice>,
}

/// A hold on `device`'s graph region for one captured graph.
pub fn hold_graph_region(device: &candle_core::Device) -> GraphHold {
    #[cfg(feature = "arena")]
    {
        let device = match device {
            candle_core::Device::Cuda(d) if vmm::hold(d, 1) => Some(d.clone()),
            _ => None,
        };
        GraphHold { device }
    }
    #[cfg(not(feature = "arena"))]
    {
        let _ = device;
        GraphHold {}
    }
}

impl Drop for GraphHold {
    fn drop(&mut self) {
        #[cfg(feature = "arena")]
        if let Some(d) = &self.device {
            vmm::hold(d, -1);
        }
    }
}

/// The figures of `device`'s arena; `None` where it has none.
pub fn stats(device: &candle_core::Device) -> Option<ArenaStats> {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        return vmm::stats(d);
    }
    let _ = device;
    None
}

/// Restarts the arena's high-water marks (call with the device synchronised).
pub fn reset_high(device: &candle_core::Device) {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        vmm::reset_high(d);
    }
    let _ = device;
}

/// Gives every mapped piece no live block touches back to the device (synchronises the context
/// first). Errors are the driver's.
pub fn trim(device: &candle_core::Device) -> Result<(), String> {
    #[cfg(feature = "arena")]
    if let candle_core::Device::Cuda(d) = device {
        return vmm::trim(d);
    }
    let _ = device;
    Ok(())
}

#[cfg(feature = "arena")]
mod vmm {
    //! The arenas of the process (one per device), their virtual ranges and mappings, and the
    //! hook cudarc calls.
    use super::{ArenaStats, Placement};
    use candle_core::cuda_backend::cudarc::driver::{alloc_hook, sys};
    use candle_core::CudaDevice;
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Largest piece mapped at once: a long-lived block (a cached buffer) keeps at most this
    /// much of its neighbourhood mapped after a trim.
    const PIECE: u64 = 32 << 20;

    /// What serves a thread: an arena, and which of its regions.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Target {
        pub idx: usize,
        /// the graph region (a capture), not the eager one
        pub graph: bool,
    }

    thread_local! {
        /// The arena region serving this thread now.
        pub(super) static SERVING: Cell<Option<Target>> = const { Cell::new(None) };
    }

    struct Arena {
        ordinal: usize,
        /// the stream this arena serves (candle's stream handle for the device)
        stream: usize,
        /// start of the reservation: the eager region `[0, size)`, then the graph region
        /// `[size, 2 size)` (offsets below are from `base`)
        base: sys::CUdeviceptr,
        size: u64,
        granule: u64,
        place: Placement,
        /// placement in the graph region (offsets from `base + size`)
        graph_place: Placement,
        /// captured graphs alive that replay over the graph region
        graph_holds: usize,
        /// offset -> (length, handle) of each mapped piece
        pieces: BTreeMap<u64, (u64, sys::CUmemGenericAllocationHandle)>,
        mapped: u64,
        mapped_high: u64,
        /// of `mapped`, the graph region's
        graph_mapped: u64,
        /// span of the graph region (from its start) given back by a park, to map again
        graph_parked: u64,
        prop: sys::CUmemAllocationProp,
    }

    // SAFETY: the raw handles are plain driver values, used only under the mutex.
    unsafe impl Send for Arena {}

    static ARENAS: Mutex<Vec<Arena>> = Mutex::new(Vec::new());

    fn arenas() -> std::sync::MutexGuard<'static, Vec<Arena>> {
        ARENAS.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ok(r: sys::CUresult) -> Result<(), sys::CUresult> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(r)
        }
    }

    impl Arena {
        /// Maps whatever of `[off, off + len)` is not mapped yet, in granule-aligned pieces of at
        /// most [`PIECE`] bytes.
        fn ensure_mapped(&mut self, off: u64, len: u64) -> Result<(), sys::CUresult> {
            let g = self.granule;
            let (mut cur, end) = (off / g * g, (off + len).div_ceil(g) * g);
            while cur < end {
                if let Some((&s, &(l, _))) = self.pieces.range(..=cur).next_back() {
                    if s + l > cur {
                        cur = s + l;
                        continue;
                    }
                }
                let next = self.pieces.range(cur..).next().map_or(end, |(&s, _)| s.min(end));
                let piece_end = next.min(cur + PIECE);
                self.map(cur, piece_end - cur)?;
                cur = piece_end;
            }
            Ok(())
        }

        fn map(&mut self, off: u64, len: u64) -> Result<(), sys::CUresult> {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer to a local; prop describes pinned memory on this device.
            ok(unsafe { sys::cuMemCreate(&mut h, len as usize, &self.prop, 0) })?;
            let ptr = self.base + off;
            // SAFETY: [ptr, ptr + len) lies in this arena's reserved range and is not mapped.
            if let Err(e) = ok(unsafe { sys::cuMemMap(ptr, len as usize, 0, h, 0) }) {
                // SAFETY: h was created above and is mapped nowhere.
                unsafe { sys::cuMemRelease(h) };
                return Err(e);
            }
            let access =
                sys::CUmemAccessDesc { location: self.prop.location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
            // SAFETY: the range was just mapped; one access descriptor is passed.
            if let Err(e) = ok(unsafe { sys::cuMemSetAccess(ptr, len as usize, &access, 1) }) {
                // SAFETY: the range was mapped above with h, and nothing used it yet.
                unsafe {
                    sys::cuMemUnmap(ptr, len as usize);
                    sys::cuMemRelease(h);
                }
                return Err(e);
            }
            self.pieces.insert(off, (len, h));
            self.mapped += len;
            if off >= self.size {
                self.graph_mapped += len;
            }
            self.mapped_high = self.mapped_high.max(self.mapped);
            Ok(())
        }

        fn unmap_piece(&mut self, s: u64) {
            if let Some((l, h)) = self.pieces.remove(&s) {
                // SAFETY: the piece is mapped at base + s with handle h, and nothing uses it: the
                // callers synchronised the context, and no block or graph needs it now.
                unsafe {
                    sys::cuMemUnmap(self.base + s, l as usize);
                    sys::cuMemRelease(h);
                }
                self.mapped -= l;
                if s >= self.size {
                    self.graph_mapped -= l;
                }
            }
        }

        /// Unmaps the whole graph region, remembering the span graphs hold (the device must be
        /// idle and no graph launched until [`Self::unpark`]).
        fn park(&mut self) {
            if self.graph_holds == 0 {
                self.graph_parked = 0;
            }
            let graph: Vec<(u64, u64)> = self.pieces.range(self.size..).map(|(&s, &(l, _))| (s, l)).collect();
            if self.graph_holds > 0 {
                let end = graph.iter().map(|&(s, l)| s + l - self.size).max().unwrap_or(0);
                self.graph_parked = self.graph_parked.max(end);
            }
            for (s, _) in graph {
                self.unmap_piece(s);
            }
        }

        /// Maps the parked span again, where graphs still hold it.
        fn unpark(&mut self) -> Result<(), sys::CUresult> {
            let span = std::mem::take(&mut self.graph_parked);
            if self.graph_holds > 0 && span > 0 {
                if let Err(e) = self.ensure_mapped(self.size, span) {
                    self.graph_parked = span;
                    return Err(e);
                }
            }
            Ok(())
        }

        /// Unmaps every piece no live block touches, and the graph region's only when no graph
        /// replays over it (the device must be idle).
        fn trim(&mut self) {
            let idle: Vec<u64> = self
                .pieces
                .iter()
                .filter(|(&s, &(l, _))| {
                    if s < self.size {
                        self.place.is_free(s, l)
                    } else {
                        self.graph_holds == 0 && self.graph_place.is_free(s - self.size, l)
                    }
                })
                .map(|(&s, _)| s)
                .collect();
            for s in idle {
                self.unmap_piece(s);
            }
        }

        /// The graph region counts as used in full while a graph holds it: its replays use
        /// all of it, without the allocations the placement would see.
        fn stats(&self) -> ArenaStats {
            let graphs = if self.graph_holds > 0 { self.graph_mapped } else { self.graph_place.used() };
            let graphs_high = if self.graph_holds > 0 { self.graph_mapped } else { self.graph_place.used_high() };
            ArenaStats {
                used: self.place.used() + graphs,
                mapped: self.mapped,
                used_high: self.place.used_high() + graphs_high,
                mapped_high: self.mapped_high,
            }
        }
    }

    fn hook_alloc(stream: sys::CUstream, bytes: usize) -> Option<sys::CUdeviceptr> {
        if bytes == 0 {
            return None;
        }
        let t = SERVING.with(|s| s.get())?;
        let mut all = arenas();
        let a = all.get_mut(t.idx)?;
        if a.stream != stream as usize {
            return None;
        }
        let (region, place) = if t.graph { (a.size, &mut a.graph_place) } else { (0, &mut a.place) };
        let (off, len) = place.alloc(bytes as u64)?;
        if a.ensure_mapped(region + off, len).is_err() {
            // out of device memory: the pool gets its chance, and reports the error if it fails
            if t.graph {
                a.graph_place.free(off);
            } else {
                a.place.free(off);
            }
            return None;
        }
        Some(a.base + region + off)
    }

    fn hook_free(ptr: sys::CUdeviceptr) -> bool {
        let mut all = arenas();
        for a in all.iter_mut() {
            if ptr >= a.base && ptr < a.base + a.size {
                a.place.free(ptr - a.base);
                return true;
            }
            if ptr >= a.base + a.size && ptr < a.base + 2 * a.size {
                // a released graph buffer is no longer live there: nothing to take back
                a.graph_place.free(ptr - a.base - a.size);
                return true;
            }
        }
        false
    }

    /// The index of `d`'s arena, made on first use; `None` where the device cannot have one.
    pub(super) fn arena_for(d: &CudaDevice) -> Option<usize> {
        let ordinal = d.cuda_stream().context().ordinal();
        let mut all = arenas();
        if let Some(i) = all.iter().position(|a| a.ordinal == ordinal) {
            return Some(i);
        }
        match create(d) {
            Ok(a) => {
                alloc_hook::install(hook_alloc, hook_free);
                tracing::info!(
                    ordinal,
                    reserved_gib = a.size as f64 / (1u64 << 30) as f64,
                    granule = a.granule,
                    "device-memory arena created"
                );
                all.push(a);
                Some(all.len() - 1)
            }
            Err(e) => {
                tracing::warn!(ordinal, error = %e, "no device-memory arena (the stream-ordered pool serves every allocation)");
                None
            }
        }
    }

    fn create(d: &CudaDevice) -> Result<Arena, String> {
        let stream = d.cuda_stream();
        let ctx = stream.context().clone();
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let vmm =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).map_err(|e| e.to_string())?;
        if vmm == 0 {
            return Err("the device does not support virtual memory management".into());
        }
        let (_, total) = ctx.mem_get_info().map_err(|e| e.to_string())?;
        // SAFETY: a zeroed prop is valid; the fields that matter are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ctx.cu_device();
        let mut granule: usize = 0;
        // SAFETY: out-pointer to a local; prop is initialised.
        ok(unsafe {
            sys::cuMemGetAllocationGranularity(&mut granule, &prop, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        })
        .map_err(|e| format!("cuMemGetAllocationGranularity: {e:?}"))?;
        let granule = (granule as u64).max(super::ALIGN);
        let size = super::reservation_size(total as u64, super::RESERVATION_CAP.load(std::sync::atomic::Ordering::Relaxed), granule);
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only (the eager and the graph region); out-pointer to a
        // local.
        ok(unsafe { sys::cuMemAddressReserve(&mut base, 2 * size as usize, granule as usize, 0, 0) })
            .map_err(|e| format!("cuMemAddressReserve: {e:?}"))?;
        Ok(Arena {
            ordinal: ctx.ordinal(),
            stream: stream.cu_stream() as usize,
            base,
            size,
            granule,
            place: Placement::new(size),
            graph_place: Placement::new(size),
            graph_holds: 0,
            pieces: BTreeMap::new(),
            mapped: 0,
            mapped_high: 0,
            graph_mapped: 0,
            graph_parked: 0,
            prop,
        })
    }

    fn with<T>(d: &CudaDevice, f: impl FnOnce(&mut Arena) -> T) -> Option<T> {
        let ordinal = d.cuda_stream().context().ordinal();
        arenas().iter_mut().find(|a| a.ordinal == ordinal).map(f)
    }

    pub(super) fn stats(d: &CudaDevice) -> Option<ArenaStats> {
        with(d, |a| a.stats())
    }

    pub(super) fn release_graph_region(d: &CudaDevice) -> Option<usize> {
        with(d, |a| {
            let live = a.graph_place.live_blocks();
            a.graph_place = Placement::new(a.size);
            live
        })
    }

    /// Adds `delta` holds on the graph region; `false` where `d` has no arena.
    pub(super) fn hold(d: &CudaDevice, delta: isize) -> bool {
        with(d, |a| a.graph_holds = a.graph_holds.saturating_add_signed(delta)).is_some()
    }

    pub(super) fn reset_high(d: &CudaDevice) {
        with(d, |a| {
            a.place.reset_high();
            a.graph_place.reset_high();
            a.mapped_high = a.mapped;
        });
    }

    pub(super) fn park_graph_region(d: &CudaDevice) -> Result<(), String> {
        let ctx = d.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        ctx.synchronize().map_err(|e| e.to_string())?;
        with(d, |a| a.park());
        Ok(())
    }

    pub(super) fn unpark_graph_region(d: &CudaDevice) -> Result<(), String> {
        d.cuda_stream().context().bind_to_thread().map_err(|e| e.to_string())?;
        with(d, |a| a.unpark()).unwrap_or(Ok(())).map_err(|e| format!("mapping the CUDA graph region again: {e:?}"))
    }

    pub(super) fn trim(d: &CudaDevice) -> Result<(), String> {
        let ctx = d.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        // every stream of the context: a piece is only unmapped when nothing can still use it
        ctx.synchronize().map_err(|e| e.to_string())?;
        with(d, |a| a.trim());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_is_the_smaller_of_device_and_cap_in_whole_granules() {
        const MIB: u64 = 1 << 20;
        // an 8 GiB board whose budget is 3 GiB: 3 GiB reserved, not 8
        assert_eq!(reservation_size(8192 * MIB, 3072 * MIB, 2 * MIB), 3072 * MIB);
        assert_eq!(reservation_size(8192 * MIB, 3072 * MIB + 1, 2 * MIB), 3074 * MIB);
        // no cap: the device's memory
        assert_eq!(reservation_size(143_771 * MIB, u64::MAX, 2 * MIB), 143_772 * MIB);
        assert_eq!(reservation_size(100, 50, 0), 50);
    }

    #[test]
    fn best_fit_takes_the_smallest_block_that_fits_and_coalesces() {
        let mut p = Placement::new(100 * ALIGN);
        let a = p.alloc(10 * ALIGN).unwrap();
        let b = p.alloc(3 * ALIGN).unwrap();
        let c = p.alloc(20 * ALIGN).unwrap();
        let d = p.alloc(5 * ALIGN).unwrap();
        assert_eq!((a.0, b.0, c.0, d.0), (0, 10 * ALIGN, 13 * ALIGN, 33 * ALIGN));
        // holes of 3 and 20 blocks: 2 goes into the 3-hole, 15 into the 20-hole
        p.free(b.0).unwrap();
        p.free(c.0).unwrap(); // merges with b's hole: one hole of 23 at 10
        assert_eq!(p.alloc(2 * ALIGN).unwrap().0, 10 * ALIGN);
        let mut q = Placement::new(100 * ALIGN);
        let x = q.alloc(3 * ALIGN).unwrap();
        let _y = q.alloc(ALIGN).unwrap();
        let z = q.alloc(20 * ALIGN).unwrap();
        let _w = q.alloc(ALIGN).unwrap();
        q.free(x.0).unwrap();
        q.free(z.0).unwrap();
        assert_eq!(q.alloc(2 * ALIGN).unwrap().0, 0, "the 3-block hole, not the 20-block one");
        assert_eq!(q.alloc(15 * ALIGN).unwrap().0, 4 * ALIGN);
    }

    #[test]
    fn everything_freed_is_one_block_again() {
        let mut p = Placement::new(64 * ALIGN);
        let offs: Vec<u64> = (1..=6).map(|i| p.alloc(i * ALIGN - 7).unwrap().0).collect();
        for &o in offs.iter().rev().step_by(2).chain(offs.iter().step_by(2)) {
            assert!(p.free(o).is_some());
        }
        assert_eq!(p.used(), 0);
        assert!(p.is_free(0, 64 * ALIGN));
        assert_eq!(p.alloc(64 * ALIGN).unwrap().0, 0);
        assert!(p.free(12345).is_none(), "no live block there");
    }

    #[test]
    fn sizes_round_up_and_full_means_none() {
        let mut p = Placement::new(4 * ALIGN + 100);
        assert_eq!(p.capacity(), 4 * ALIGN);
        assert_eq!(p.alloc(1).unwrap(), (0, ALIGN));
        assert_eq!(p.alloc(0).unwrap(), (ALIGN, ALIGN), "zero bytes still get a block of their own");
        assert!(p.alloc(2 * ALIGN + 1).is_none());
        assert_eq!(p.alloc(2 * ALIGN).unwrap(), (2 * ALIGN, 2 * ALIGN));
        assert!(p.alloc(1).is_none());
    }

    #[test]
    fn high_water_marks_follow_the_pass_and_reset_to_what_is_live() {
        let mut p = Placement::new(1000 * ALIGN);
        let keep = p.alloc(ALIGN).unwrap();
        let big = p.alloc(100 * ALIGN).unwrap();
        let after = p.alloc(10 * ALIGN).unwrap();
        assert_eq!(p.end_high(), 111 * ALIGN);
        assert_eq!(p.used_high(), 111 * ALIGN);
        p.free(big.0);
        p.free(after.0);
        assert!(p.is_free(ALIGN, 999 * ALIGN) && !p.is_free(0, ALIGN));
        assert_eq!(p.used_high(), 111 * ALIGN, "a high-water mark stays until reset");
        p.reset_high();
        assert_eq!((p.used_high(), p.end_high()), (ALIGN, ALIGN));
        assert_eq!(p.live_blocks(), 1);
        p.free(keep.0);
        assert_eq!(p.live_end(), 0);
    }

    /// The property the planner relies on: the same sequence of allocations and frees from the
    /// same starting state lands every block at the same offset, so a pass's span repeats.
    #[test]
    fn the_same_sequence_gives_the_same_span() {
        // a pass-like sequence: activations that live across a few layers, a workspace per layer
        fn pass(p: &mut Placement, batch: u64) -> u64 {
            p.reset_high();
            let mut alive: Vec<u64> = Vec::new();
            for layer in 0..40u64 {
                let act = (batch * (1 + layer % 7) * 3 * ALIGN) + layer * 17;
                let ws = p.alloc(batch * ALIGN * (layer % 3)).unwrap();
                alive.push(p.alloc(act).unwrap().0);
                p.free(ws.0);
                if alive.len() > 3 {
                    let o = alive.remove(layer as usize % 3);
                    p.free(o);
                }
            }
            for o in alive {
                p.free(o);
            }
            p.end_high()
        }
        let mut p = Placement::new(1 << 40);
        let cached = p.alloc(5000).unwrap(); // a long-lived block made before the passes
        let spans: Vec<u64> = (0..4).map(|_| pass(&mut p, 8)).collect();
        assert!(spans.windows(2).all(|w| w[0] == w[1]), "{spans:?}");
        assert!(pass(&mut p, 16) > spans[0]);
        assert_eq!(pass(&mut p, 8), spans[0], "a larger pass in between changes nothing");
        assert_eq!(p.used(), cached.1);
    }
}
