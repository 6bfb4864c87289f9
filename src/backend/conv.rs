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

/// One convolution algorithm as cuDNN's timed search reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedAlgo {
    /// Implicit GEMM without precomputed indices (cuDNN's `IMPLICIT_GEMM`).
    pub plain_implicit_gemm: bool,
    /// The search's fastest time for it (ms).
    pub time: f32,
    /// Scratch it needs (bytes).
    pub workspace: usize,
}

/// Scratch below which a saving is not worth a slower algorithm.
pub const WORKSPACE_WORTH_SAVING: usize = 1 << 20;

/// How much faster by the search's timing plain implicit GEMM must be than every other usable
/// algorithm to be chosen.
pub const PLAIN_IMPLICIT_GEMM_MARGIN: f32 = 2.0;

/// The algorithm a convolution shape runs with, from the search's usable candidates (index into
/// `algos`), `slack` being how much slower than the fastest one may be to save scratch:
///
/// - plain implicit GEMM only where it is [`PLAIN_IMPLICIT_GEMM_MARGIN`] times faster than every
///   other candidate, or the only one: the search times it faster than it runs in the pass. On
///   an H200 (yolov9t, f16, NHWC) the processes whose search took it over the precomputed
///   variant for the small convolutions (16 -> 16 channels at 80x80, 24 -> 24 at 40x40, 32 -> 32
///   at 20x20) ran batch 1 in 1.7-2.7 ms instead of 1.33, and batch 32 slower than 16
///   (BENCHMARKS.md, "Small batches and cuDNN's choice");
/// - then the fastest, unless one within the slack of it needs at least
///   [`WORKSPACE_WORTH_SAVING`] less scratch: then the one needing least (ties: the faster).
pub fn choose_algo(algos: &[TimedAlgo], slack: f32) -> Option<usize> {
    let others = algos.iter().filter(|a| !a.plain_implicit_gemm).map(|a| a.time).fold(f32::INFINITY, f32::min);
    let eligible: Vec<usize> =
        (0..algos.len()).filter(|&i| !algos[i].plain_implicit_gemm || algos[i].time * PLAIN_IMPLICIT_GEMM_MARGIN <= others).collect();
    let fastest = *eligible.iter().min_by(|&&a, &&b| algos[a].time.total_cmp(&algos[b].time))?;
    let (time, ws) = (algos[fastest].time, algos[fastest].workspace);
    eligible
        .into_iter()
        .filter(|&i| algos[i].time <= time * (1.0 + slack) && algos[i].workspace + WORKSPACE_WORTH_SAVING <= ws)
        .min_by(|&a, &b| algos[a].workspace.cmp(&algos[b].workspace).then(algos[a].time.total_cmp(&algos[b].time)))
        .or(Some(fastest))
}

/// How much faster two halves of a batch must time than the whole for a convolution to run as
/// two halves.
pub const SPLIT_MARGIN: f32 = 1.25;

/// Whether a convolution whose whole batch timed `whole` ms runs as two halves that took
/// `halves` ms together: only with a clear lead, since the timings of near-equal choices vary
/// from run to run and one launch more costs a few microseconds.
pub fn split_pays(whole: f32, halves: f32) -> bool {
    halves.is_finite() && halves * SPLIT_MARGIN <= whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn algo(plain: bool, time: f32, workspace: usize) -> TimedAlgo {
        TimedAlgo { plain_implicit_gemm: plain, time, workspace }
    }

    #[test]
    fn choice_takes_the_fastest_and_saves_only_real_scratch() {
        const M: usize = 1 << 20;
        // a few bytes of scratch are not worth 4 % of time
        assert_eq!(choose_algo(&[algo(false, 1.00, 128), algo(false, 1.04, 0)], 0.05), Some(0));
        // 64 MiB are, within the slack; not beyond it
        assert_eq!(choose_algo(&[algo(false, 1.00, 64 * M), algo(false, 1.04, 0)], 0.05), Some(1));
        assert_eq!(choose_algo(&[algo(false, 1.00, 64 * M), algo(false, 1.10, 0)], 0.05), Some(0));
        // among several that save, the least scratch, ties to the faster
        let a = [algo(false, 1.0, 64 * M), algo(false, 1.03, 2 * M), algo(false, 1.02, 2 * M), algo(false, 1.01, 32 * M)];
        assert_eq!(choose_algo(&a, 0.05), Some(2));
        assert_eq!(choose_algo(&[], 0.05), None);
    }

    #[test]
    fn plain_implicit_gemm_needs_a_clear_lead_or_no_rival() {
        // timed a little faster (or equal, with less scratch): the precomputed variant runs
        assert_eq!(choose_algo(&[algo(true, 0.010, 0), algo(false, 0.011, 128)], 0.05), Some(1));
        assert_eq!(choose_algo(&[algo(true, 0.010, 0), algo(false, 0.010, 128)], 0.0), Some(1));
        // twice as fast: taken
        assert_eq!(choose_algo(&[algo(true, 0.010, 0), algo(false, 0.020, 128)], 0.05), Some(0));
        // the only usable one: taken
        assert_eq!(choose_algo(&[algo(true, 0.010, 0)], 0.05), Some(0));
    }

    #[test]
    fn a_batch_splits_only_for_a_clear_lead() {
        // yolov9t's 24 -> 24 @40x40 at batch 32 on an H200: 43.7 us whole, 13.0 us as two halves
        assert!(split_pays(0.0437, 0.0130));
        // the halves as fast as the whole, or a little faster: not worth a launch more
        assert!(!split_pays(0.020, 2.0 * 0.010));
        assert!(!split_pays(0.020, 0.017));
        // an unplanned half never wins
        assert!(!split_pays(0.020, f32::INFINITY));
        assert!(!split_pays(f32::INFINITY, f32::INFINITY));
    }

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
