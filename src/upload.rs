//! Host-to-device upload of a batch's pixels through one reused page-locked staging buffer.
//!
//! candle's `Tensor::to_device` copies from pageable memory: the driver stages it through its own
//! small pinned buffer, synchronously, at a fraction of the bus speed (a batch of 128 pictures at
//! 640 is 157 MB). Here the pixels are packed straight into a pinned buffer that lives as long as
//! the detector (grown, never shrunk) and copied asynchronously on the device's stream; the next
//! batch waits for that copy before it overwrites the buffer. `YOLO_EDGE_UPLOAD=pageable` keeps
//! candle's path (A/B runs).

use candle_core::{Device, Shape, Tensor};

/// The staging buffer; empty until the first upload to a CUDA device.
#[derive(Default)]
pub struct Uploader {
    #[cfg(feature = "cuda")]
    staging: std::sync::Mutex<Option<cuda::Staging>>,
}

/// Whether uploads go through the pinned staging buffer (`YOLO_EDGE_UPLOAD=pageable`: no).
#[cfg(feature = "cuda")]
fn pinned() -> bool {
    static PINNED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PINNED.get_or_init(|| std::env::var("YOLO_EDGE_UPLOAD").map_or(true, |v| v != "pageable"))
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
            Device::Cuda(d) if pinned() => {
                // a poisoned lock only means an earlier upload panicked; the buffer is still valid
                let mut g = self.staging.lock().unwrap_or_else(|p| p.into_inner());
                let slice = cuda::upload(&mut g, d, parts, total)?;
                let storage = candle_core::CudaStorage::wrap_cuda_slice(slice, d.clone());
                Ok(Tensor::from_storage(candle_core::Storage::Cuda(storage), shape, candle_core::op::BackpropOp::none(), false))
            }
            _ => {
                let mut bytes = Vec::with_capacity(total);
                for p in parts {
                    bytes.extend_from_slice(p);
                }
                Tensor::from_vec(bytes, shape, &Device::Cpu)?.to_device(device)
            }
        }
    }
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
        let mut o = 0;
        for p in parts {
            host[o..o + p.len()].copy_from_slice(p);
            o += p.len();
        }
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
    fn cpu_upload_concatenates_parts() {
        let u = Uploader::default();
        let t = u.upload(&[&[1u8, 2, 3], &[4, 5, 6]], (2, 3), &Device::Cpu).unwrap();
        assert_eq!(t.to_vec2::<u8>().unwrap(), vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert!(u.upload(&[&[1u8, 2]], (3,), &Device::Cpu).is_err());
    }
}
