//! The convolution entry point of the model: the fastest path per device and call shape.
//!
//! - A 1x1 stride-1 convolution is one batched GEMM, `W (Cout x Cin) @ X_b (Cin x HW)`, whose
//!   output is already NCHW: no im2col copy of the input and no transposing copy of the output
//!   (candle's conv2d makes both).
//! - Other shapes on CUDA go to cuDNN with one plan per shape ([`crate::backend::cuda::cudnn`],
//!   feature `cudnn`), else to candle's im2col + GEMM.
//!
//! The f32 CPU path of the model's fused convolutions is [`crate::backend::cpu::conv`].

use candle_core::Tensor;

/// A 1x1, stride-1, ungrouped convolution without bias as a batched GEMM.
pub fn conv1x1_matmul(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    let (b, cin, h, wd) = x.dims4()?;
    let (cout, wcin, kh, kw) = w.dims4()?;
    if (wcin, kh, kw) != (cin, 1, 1) {
        candle_core::bail!("conv1x1_matmul: weight {:?} does not fit input {:?}", w.dims(), x.dims());
    }
    let x3 = x.contiguous()?.reshape((b, cin, h * wd))?;
    let w3 = w.reshape((cout, cin))?.broadcast_left(b)?;
    w3.matmul(&x3)?.reshape((b, cout, h, wd))
}

/// `x.conv2d(w, padding, stride, 1, groups)`, through the fastest path selected for its shape.
pub fn conv2d(x: &Tensor, w: &Tensor, padding: usize, stride: usize, groups: usize) -> candle_core::Result<Tensor> {
    let (_, _, kh, kw) = w.dims4()?;
    if kh == 1 && kw == 1 && stride == 1 && padding == 0 && groups == 1 {
        return conv1x1_matmul(x, w);
    }
    #[cfg(feature = "cudnn")]
    if cudnn_takes(x) {
        if let Some(r) = crate::backend::cuda::cudnn::conv2d(x, w, padding, stride, groups, false) {
            return r;
        }
    }
    x.conv2d(w, padding, stride, 1, groups)
}

/// Whether convolutions of `x` (other than 1x1 GEMMs) go to cuDNN: a CUDA tensor in a build with
/// the `cudnn` feature.
pub fn cudnn_takes(x: &Tensor) -> bool {
    x.device().is_cuda() && cfg!(feature = "cudnn")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
        let n = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
        d / n
    }

    #[test]
    fn matmul_path_equals_conv2d() {
        let dev = Device::Cpu;
        for (b, cin, cout, h, w) in [(1, 8, 16, 5, 7), (3, 32, 24, 4, 4), (2, 3, 1, 9, 2)] {
            let x = Tensor::randn(0f32, 1f32, (b, cin, h, w), &dev).unwrap();
            let k = Tensor::randn(0f32, 1f32, (cout, cin, 1, 1), &dev).unwrap();
            let want = x.conv2d(&k, 0, 1, 1, 1).unwrap();
            let got = conv1x1_matmul(&x, &k).unwrap();
            assert_eq!(got.dims(), want.dims());
            assert!(rel(&got, &want) < 1e-5, "{:?}", (b, cin, cout, h, w));
        }
        // a non-contiguous input (a channel slice, as after a split)
        let x = Tensor::randn(0f32, 1f32, (2, 16, 6, 6), &dev).unwrap().narrow(1, 8, 8).unwrap();
        let k = Tensor::randn(0f32, 1f32, (4, 8, 1, 1), &dev).unwrap();
        assert!(rel(&conv1x1_matmul(&x, &k).unwrap(), &x.conv2d(&k, 0, 1, 1, 1).unwrap()) < 1e-5);
        // wrong shapes are errors, not panics
        let k3 = Tensor::zeros((4, 8, 3, 3), DType::F32, &dev).unwrap();
        assert!(conv1x1_matmul(&x, &k3).is_err());
    }
}
