//! Device memory queries: what the device has free, and how much this process used at its peak.
//!
//! Free memory: the CPU and an integrated GPU (Jetson, device attribute `INTEGRATED`, where the
//! driver counts the page cache as used) share host memory, so theirs is `MemAvailable` capped
//! by every cgroup limit above this process; a discrete GPU's is `cuMemGetInfo`. Both come from
//! [`crate::backend::hostmem`], which also names the limit that binds. Peak usage is the
//! high-water mark of the stream-ordered memory pool that candle allocates from
//! (`cuMemAllocAsync`) plus that of the activation arena where there is one
//! (`crate::backend::arena`), reset between measurements; on the CPU the peak resident set
//! (`VmHWM`, reset through `/proc/self/clear_refs`).

use candle_core::Device;
use serde::Serialize;

pub use super::hostmem::{meminfo_field, DeviceMemory, DeviceReport, HostMemError, Limit, MemorySource, SysRoot};

/// Why memory could not be queried.
#[derive(Debug, thiserror::Error)]
pub enum DevMemError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} has no field {field}")]
    Missing { path: String, field: String },
    #[error("CUDA driver call {call} failed: {reason}")]
    Cuda { call: &'static str, reason: String },
    #[error("memory queries are not supported on {0}")]
    Unsupported(String),
    #[error(transparent)]
    Host(#[from] HostMemError),
}

fn read(path: &str) -> Result<String, DevMemError> {
    std::fs::read_to_string(path).map_err(|source| DevMemError::Io { path: path.into(), source })
}

/// Free and total memory of `device`, and the limit that binds.
pub fn device_memory(device: &Device) -> Result<DeviceMemory, DevMemError> {
    device_memory_in(device, &SysRoot::host())
}

/// [`device_memory`] with the host's memory files read under `root`.
pub fn device_memory_in(device: &Device, root: &SysRoot) -> Result<DeviceMemory, DevMemError> {
    match device {
        Device::Cpu => Ok(super::hostmem::device_memory_at(root, DeviceReport::Cpu)?),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => cuda::device_memory(d, root),
        #[allow(unreachable_patterns)]
        other => Err(DevMemError::Unsupported(format!("{:?}", other.location()))),
    }
}

/// Peak-memory measurement for one device: `reset()`, run work, read `peak()`.
pub struct PeakMeter {
    device: Device,
}

/// One reading of a process's memory on a device, in bytes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    /// Bytes in use now (pool used / resident set).
    pub used: u64,
    /// Bytes reserved from the device now (pool reserved / resident set).
    pub reserved: u64,
    /// High-water mark of `used` since the last reset.
    pub used_high: u64,
    /// High-water mark of `reserved` since the last reset.
    pub reserved_high: u64,
}

impl PeakMeter {
    pub fn new(device: &Device) -> Self {
        Self { device: device.clone() }
    }

    /// Forgets the high-water marks (CUDA: synchronises first).
    pub fn reset(&self) -> Result<(), DevMemError> {
        match &self.device {
            Device::Cpu => {
                // "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
                std::fs::write("/proc/self/clear_refs", "5")
                    .map_err(|source| DevMemError::Io { path: "/proc/self/clear_refs".into(), source })
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda::reset_high(d),
            #[allow(unreachable_patterns)]
            other => Err(DevMemError::Unsupported(format!("{:?}", other.location()))),
        }
    }

    /// Current and peak usage since the last reset (CUDA: synchronises first).
    pub fn usage(&self) -> Result<Usage, DevMemError> {
        match &self.device {
            Device::Cpu => {
                let path = "/proc/self/status";
                let text = read(path)?;
                let get = |f: &str| meminfo_field(&text, f).ok_or_else(|| DevMemError::Missing { path: path.into(), field: f.into() });
                let rss = get("VmRSS")?;
                let hwm = get("VmHWM")?;
                Ok(Usage { used: rss, reserved: rss, used_high: hwm, reserved_high: hwm })
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda::usage(d),
            #[allow(unreachable_patterns)]
            other => Err(DevMemError::Unsupported(format!("{:?}", other.location()))),
        }
    }

    /// Like [`usage`](Self::usage) but without synchronising the device first, for telemetry
    /// read beside running work (the figures may lag the queued work by a few kernels).
    pub fn snapshot(&self) -> Result<Usage, DevMemError> {
        match &self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda::pool_usage(d),
            _ => self.usage(),
        }
    }

    /// Keeps pool memory reserved across synchronisations (CUDA; see `cuda::hold_reserved`). A
    /// no-op on the CPU.
    pub fn hold_reserved(&self) -> Result<(), DevMemError> {
        match &self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda::hold_reserved(d),
            _ => Ok(()),
        }
    }

    /// Returns cached but unused pool memory to the device (CUDA); a no-op on the CPU.
    pub fn trim(&self) -> Result<(), DevMemError> {
        match &self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda::trim(d),
            Device::Cpu => {
                // freed tensors stay resident in the allocator's arenas; without giving them
                // back, a measurement after a larger one reads low (its pages are already
                // resident), and the resident set that the kernel judges stays at the old peak
                super::hostmem::release_free_heap();
                Ok(())
            }
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }
}

/// Bytes CUDA's graph memory pool holds on `device` now (all captured graphs of the process;
/// already part of [`PeakMeter`]'s figures); 0 elsewhere or where the driver cannot say.
pub fn graph_pool_reserved(device: &Device) -> u64 {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            cuda::graph_get(d, candle_core::cuda_backend::cudarc::driver::sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        }
        _ => 0,
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Driver calls through candle's re-exported cudarc.
    use super::{DevMemError, DeviceMemory, DeviceReport, SysRoot, Usage};
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::CudaDevice;

    fn check(call: &'static str, r: sys::CUresult) -> Result<(), DevMemError> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(DevMemError::Cuda { call, reason: format!("{r:?}") })
        }
    }

    fn err(call: &'static str) -> impl Fn(candle_core::cuda_backend::cudarc::driver::DriverError) -> DevMemError {
        move |e| DevMemError::Cuda { call, reason: e.to_string() }
    }

    pub fn device_memory(d: &CudaDevice, root: &SysRoot) -> Result<DeviceMemory, DevMemError> {
        let ctx = d.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(err("cuCtxSetCurrent"))?;
        let integrated = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED).map_err(err("cuDeviceGetAttribute"))?;
        let report = if integrated != 0 {
            DeviceReport::IntegratedGpu
        } else {
            let (free, total) = ctx.mem_get_info().map_err(err("cuMemGetInfo"))?;
            DeviceReport::DiscreteGpu { free: free as u64, total: total as u64 }
        };
        Ok(crate::backend::hostmem::device_memory_at(root, report)?)
    }

    fn pool(d: &CudaDevice) -> Result<sys::CUmemoryPool, DevMemError> {
        let ctx = d.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(err("cuCtxSetCurrent"))?;
        let mut p: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device handle comes from a live context.
        check("cuDeviceGetMemPool", unsafe { sys::cuDeviceGetMemPool(&mut p, ctx.cu_device()) })?;
        Ok(p)
    }

    fn get(p: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64, DevMemError> {
        let mut v: u64 = 0;
        // SAFETY: these attributes are cuuint64_t values written into a local.
        check("cuMemPoolGetAttribute", unsafe { sys::cuMemPoolGetAttribute(p, attr, &mut v as *mut u64 as *mut _) })?;
        Ok(v)
    }

    pub fn usage(d: &CudaDevice) -> Result<Usage, DevMemError> {
        d.cuda_stream().synchronize().map_err(err("cuStreamSynchronize"))?;
        pool_usage(d)
    }

    /// A graph memory pool attribute; 0 where the driver cannot say (graph memory nodes need
    /// CUDA 11.4+), so that the stream pool's figures still come through.
    pub fn graph_get(d: &CudaDevice, attr: sys::CUgraphMem_attribute) -> u64 {
        let mut v: u64 = 0;
        let dev = d.cuda_stream().context().cu_device();
        // SAFETY: these attributes are cuuint64_t values written into a local.
        let r = unsafe { sys::cuDeviceGetGraphMemAttribute(dev, attr, &mut v as *mut u64 as *mut _) };
        if r == sys::CUresult::CUDA_SUCCESS {
            v
        } else {
            0
        }
    }

    /// The stream pool candle allocates from plus the device's graph memory pool (where a
    /// captured CUDA graph's activations live; 0 when no graph was launched). The two high-water
    /// marks are summed: an upper bound of the joint peak.
    pub fn pool_usage(d: &CudaDevice) -> Result<Usage, DevMemError> {
        let p = pool(d)?;
        use sys::CUgraphMem_attribute as G;
        use sys::CUmemPool_attribute as A;
        let a = crate::backend::arena::stats(&candle_core::Device::Cuda(d.clone())).unwrap_or_default();
        Ok(Usage {
            used: get(p, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)? + graph_get(d, G::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) + a.used,
            reserved: get(p, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)? + graph_get(d, G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) + a.mapped,
            used_high: get(p, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)? + graph_get(d, G::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) + a.used_high,
            reserved_high: get(p, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?
                + graph_get(d, G::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
                + a.mapped_high,
        })
    }

    pub fn reset_high(d: &CudaDevice) -> Result<(), DevMemError> {
        d.cuda_stream().synchronize().map_err(err("cuStreamSynchronize"))?;
        let p = pool(d)?;
        use sys::CUmemPool_attribute as A;
        for a in [A::CU_MEMPOOL_ATTR_USED_MEM_HIGH, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH] {
            let mut zero: u64 = 0;
            // SAFETY: the high-water attributes may only be set to 0, which resets them.
            check("cuMemPoolSetAttribute", unsafe { sys::cuMemPoolSetAttribute(p, a, &mut zero as *mut u64 as *mut _) })?;
        }
        let dev = d.cuda_stream().context().cu_device();
        for a in
            [sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH]
        {
            let mut zero: u64 = 0;
            // SAFETY: as above, for the device's graph memory pool (best effort, see graph_get).
            let _ = unsafe { sys::cuDeviceSetGraphMemAttribute(dev, a, &mut zero as *mut u64 as *mut _) };
        }
        crate::backend::arena::reset_high(&candle_core::Device::Cuda(d.clone()));
        Ok(())
    }

    /// Makes the device's pool keep what it reserved across synchronisations (release threshold
    /// = all), like PyTorch's caching allocator. CUDA's default threshold is 0: every stream
    /// synchronise hands all unused pool memory back to the driver, and the next batch maps its
    /// activations (gigabytes at large batches) afresh. Memory goes back only when the agent
    /// trims ([`trim`]: when idle, after an out-of-memory error, between the planner's probes).
    pub fn hold_reserved(d: &CudaDevice) -> Result<(), DevMemError> {
        let p = pool(d)?;
        let mut all: u64 = u64::MAX;
        // SAFETY: the release threshold is a cuuint64_t read from a local.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(p, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &mut all as *mut u64 as *mut _)
        })?;
        // Reuse in stream order only: the pool may not hand out memory whose free already
        // completed on the device, or order an allocation behind an inserted dependency. Both
        // depend on timing, and with them the same pass from the same trimmed pool reserved
        // 256, 320 or 352 MiB (yolov9e batch 3); in stream order only its
        // readings repeat exactly (spread 0 % at every batch of e 16 GiB and
        // m 8 GiB, was 37.5 % and 9.1 %). One stream serves every pass, so nothing is lost.
        {
            use sys::CUmemPool_attribute as A;
            for a in [A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES] {
                let mut off: i32 = 0;
                // SAFETY: these reuse attributes are ints read from a local.
                check("cuMemPoolSetAttribute", unsafe { sys::cuMemPoolSetAttribute(p, a, &mut off as *mut i32 as *mut _) })?;
            }
        }
        Ok(())
    }

    pub fn trim(d: &CudaDevice) -> Result<(), DevMemError> {
        d.cuda_stream().synchronize().map_err(err("cuStreamSynchronize"))?;
        let p = pool(d)?;
        // SAFETY: trims unused reserved memory of a live pool down to 0 bytes kept.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(p, 0) })?;
        // and what graphs hold between launches (remapped at their next launch; best effort)
        // SAFETY: a live device handle; frees only graph memory no running graph uses.
        let _ = unsafe { sys::cuDeviceGraphMemTrim(d.cuda_stream().context().cu_device()) };
        crate::backend::arena::trim(&candle_core::Device::Cuda(d.clone()))
            .map_err(|reason| DevMemError::Cuda { call: "arena trim", reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_memory_and_peak_are_read() {
        let _memory = crate::process_memory_test_lock();
        let m = device_memory(&Device::Cpu).unwrap();
        assert!(m.total > 0 && m.free <= m.total);
        let meter = PeakMeter::new(&Device::Cpu);
        meter.reset().unwrap();
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let u = meter.usage().unwrap();
        assert!(u.used_high >= 64 << 20, "peak {} after touching 64 MiB", u.used_high);
        drop(v);
    }
}
