//! Host-to-device upload of a batch's pixels through one reused page-locked staging buffer.
//!
//! candle's `Tensor::to_device` copies from pageable memory: the driver stages it through its own
//! small pinned buffer, synchronously, at a fraction of the bus speed (a batch of 128 pictures at
//! 640 is 157 MB). Here the pixels are packed straight into a pinned buffer that lives as long as
//! the detector (grown, never shrunk) and copied asynchronously on the device's stream; the next
//! batch waits for that copy before it overwrites the buffer.

use candle_core::{Device, Shape, Tensor};

/// The staging buffer; empty until the first upload to a CUDA device.
#[derive(Default)]
pub struct Uploader {
    #[cfg(feature = "cuda")]
    staging: std::sync::Mutex<Option<cuda::Staging>>,
}

impl Uploader {
    /// A u8 tensor of `shape` on `device` holding the concatenation of `parts`.
    pub fn upload(&self, parts: &[&[u8]], shape: impl Into<Shape>, device: &Device) -> candle_core::Result<Tensor> {
        let shape = shape.into();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total != shape.elem_count() {
            candle_core::bail!("upload: {total} bytes for a tensor of shape {shape:?}");
        }
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                // a poisoned lock only means an earlier upload panicked; the buffer is still valid
                let mut g = self.staging.lock().unwrap_or_else(|p| p.into_inner());
                let slice = cuda::upload(&mut g, d, parts, total)?;
                let storage = candle_core::CudaStorage::wrap_cuda_slice(slice, d.clone());
                Ok(Tensor::from_storage(candle_core::Storage::Cuda(storage), shape, candle_core::op::BackpropOp::none(), false))
            }
            _ => {
                let mut bytes = vec![0u8; total];
                copy_parts(&mut bytes, parts);
                Tensor::from_vec(bytes, shape, &Device::Cpu)?.to_device(device)
            }
        }
    }
}

/// Threads that copy pictures into the staging buffer (`[tuning] upload_threads`). The GPU waits
/// for this copy: a large batch is copied several times faster on several threads
/// (BENCHMARKS.md, "Settled experiments": upload).
fn copy_threads() -> usize {
    crate::backend::tuning::get().upload_threads()
}

/// Copies `parts` back to back into `dst` (exactly as long as all of them), on several threads
/// when there is enough to copy.
fn copy_parts(dst: &mut [u8], parts: &[&[u8]]) {
    const PARALLEL_FROM: usize = 8 << 20;
    let mut pairs: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(parts.len());
    let mut rest = dst;
    for p in parts {
        let (d, r) = std::mem::take(&mut rest).split_at_mut(p.len());
        pairs.push((d, p));
        rest = r;
    }
    let threads = copy_threads().min(pairs.len());
    if threads <= 1 || pairs.iter().map(|p| p.1.len()).sum::<usize>() < PARALLEL_FROM {
        pairs.into_iter().for_each(|(d, p)| d.copy_from_slice(p));
        return;
    }
    let per = pairs.len().div_ceil(threads);
    std::thread::scope(|s| {
        for group in pairs.chunks_mut(per) {
            s.spawn(move || group.iter_mut().for_each(|(d, p)| d.copy_from_slice(p)));
        }
    });
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{result, CudaEvent, CudaSlice, DevicePtrMut, PinnedHostSlice};
    use candle_core::CudaDevice;

    pub struct Staging {
        host: PinnedHostSlice<u8>,
        /// recorded after the last copy out of `host`
        copied: Option<CudaEvent>,
    }

    impl Drop for Staging {
        fn drop(&mut self) {
            // the buffer is freed only after the copy reading it has finished
            if let Some(e) = &self.copied {
                let _ = e.synchronize();
            }
        }
    }

    fn derr(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error {
        candle_core::Error::Msg(format!("upload: {e}"))
    }

    pub fn upload(staging: &mut Option<Staging>, d: &CudaDevice, parts: &[&[u8]], total: usize) -> candle_core::Result<CudaSlice<u8>> {
        let stream = d.cuda_stream();
        if staging.as_ref().is_none_or(|s| s.host.len() < total) {
            if let Some(old) = staging.take() {
                if let Some(e) = &old.copied {
                    e.synchronize().map_err(derr)?;
                }
            }
            // SAFETY: plain page-locked host memory, only written by the host below.
            let host = unsafe { stream.context().alloc_pinned::<u8>(total) }.map_err(derr)?;
            *staging = Some(Staging { host, copied: None });
        }
        let s = staging.as_mut().expect("staging buffer allocated above");
        if let Some(e) = s.copied.take() {
            e.synchronize().map_err(derr)?; // the previous batch's copy has left the buffer
        }
        let host = s.host.as_mut_slice().map_err(derr)?;
        super::copy_parts(&mut host[..total], parts);
        // SAFETY: the device buffer is fully written by the copy before any kernel reads it
        // (same stream).
        let mut dst = unsafe { stream.alloc::<u8>(total) }.map_err(derr)?;
        {
            let (dp, _record) = dst.device_ptr_mut(&stream);
            // SAFETY: `host[..total]` is page-locked and stays untouched until `copied` fires.
            unsafe { result::memcpy_htod_async(dp, &host[..total], stream.cu_stream()) }.map_err(derr)?;
        }
        s.copied = Some(stream.record_event(None).map_err(derr)?);
        Ok(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_copy_keeps_the_order_of_the_parts() {
        let parts: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; (3 << 20) + i as usize]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let mut dst = vec![0xffu8; refs.iter().map(|p| p.len()).sum()];
        copy_parts(&mut dst, &refs);
        assert_eq!(dst, parts.concat());
    }

    #[test]
    fn cpu_upload_concatenates_parts() {
        let u = Uploader::default();
        let t = u.upload(&[&[1u8, 2, 3], &[4, 5, 6]], (2, 3), &Device::Cpu).unwrap();
        assert_eq!(t.to_vec2::<u8>().unwrap(), vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert!(u.upload(&[&[1u8, 2]], (3,), &Device::Cpu).is_err());
    }
}
