//! Device memory errors: recognising an out-of-memory failure in a candle error chain, and the
//! test-only OOM injector that drives the runtime fallback on the CPU.

use std::fmt;

/// Marker used by the injector; also what `candle_core::Error::wrap` of a CUDA driver OOM prints.
pub const OOM_MARKER: &str = "CUDA_ERROR_OUT_OF_MEMORY";

/// True when `e` (anywhere in its context chain) is a device out-of-memory error.
pub fn is_oom(e: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => is_oom(inner),
        #[cfg(feature = "cuda")]
        E::Cuda(b) => {
            use candle_core::cuda_backend::cudarc::driver::{sys::CUresult, DriverError};
            use candle_core::cuda_backend::CudaError;
            match b.downcast_ref::<CudaError>() {
                Some(CudaError::Cuda(DriverError(r))) | Some(CudaError::Load { cuda: DriverError(r), .. }) => {
                    *r == CUresult::CUDA_ERROR_OUT_OF_MEMORY
                }
                Some(_) => false,
                None => b.downcast_ref::<DriverError>().is_some_and(|d| d.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            }
        }
        // `candle_core::Error::wrap(DriverError)` (cuDNN path) and the injector erase the type.
        E::Wrapped(d) => d.to_string().contains(OOM_MARKER),
        E::WrappedContext { wrapped, .. } => wrapped.to_string().contains(OOM_MARKER),
        E::Msg(m) => m.contains(OOM_MARKER),
        _ => false,
    }
}

/// The error the injector raises in place of a forward pass.
#[derive(Debug, Clone, Copy)]
pub struct InjectedOom {
    pub batch: usize,
}

impl fmt::Display for InjectedOom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OOM_MARKER} (injected by [debug] inject_oom at batch {})", self.batch)
    }
}

impl std::error::Error for InjectedOom {}

/// Test-only OOM injector: `batch>=N` fails every forward of N or more pictures;
/// `batch>=N;until=F` stops failing once F frames have been processed. Set by `[debug] inject_oom`
/// in the config (and nothing else): tests drive the runtime fallback with it on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomInjector {
    pub min_batch: usize,
    pub until_frames: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid OOM injector `{0}` (expected `batch>=N` or `batch>=N;until=F`)")]
pub struct InjectorSpecError(pub String);

impl OomInjector {
    pub fn parse(spec: &str) -> Result<Self, InjectorSpecError> {
        let bad = || InjectorSpecError(spec.to_string());
        let mut parts = spec.split(';').map(str::trim);
        let min_batch = parts
            .next()
            .and_then(|p| p.strip_prefix("batch>="))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .filter(|&n| n >= 1)
            .ok_or_else(bad)?;
        let mut until_frames = None;
        for p in parts.filter(|p| !p.is_empty()) {
            until_frames = Some(p.strip_prefix("until=").and_then(|n| n.trim().parse().ok()).ok_or_else(bad)?);
        }
        Ok(Self { min_batch, until_frames })
    }

    /// The injected error for a forward of `batch` pictures after `frames_done` frames, if any.
    pub fn check(&self, batch: usize, frames_done: u64) -> Option<candle_core::Error> {
        let active = self.until_frames.is_none_or(|u| frames_done < u);
        (active && batch >= self.min_batch).then(|| candle_core::Error::wrap(InjectedOom { batch }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errors() {
        let inj = candle_core::Error::wrap(InjectedOom { batch: 4 });
        assert!(is_oom(&inj));
        assert!(is_oom(&candle_core::Error::wrap(InjectedOom { batch: 2 }).context("layer 3")));
        assert!(!is_oom(&candle_core::Error::Msg("shape mismatch".into())));
        assert!(is_oom(&candle_core::Error::Msg(format!("{OOM_MARKER}: out of memory"))));
    }

    #[test]
    fn parses_injector() {
        assert_eq!(OomInjector::parse("batch>=4").unwrap(), OomInjector { min_batch: 4, until_frames: None });
        let i = OomInjector::parse("batch>=2; until=100").unwrap();
        assert_eq!(i.until_frames, Some(100));
        assert!(i.check(2, 99).is_some() && i.check(1, 0).is_none() && i.check(4, 100).is_none());
        assert!(OomInjector::parse("batch>=0").is_err() && OomInjector::parse("x").is_err());
    }
}
