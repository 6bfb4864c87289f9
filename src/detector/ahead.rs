//! Decoding the next batches' JPEGs on the device while the current batch's pass runs.
//!
//! With nvJPEG ([`Detector::use_gpu_jpeg`]) one thread would decode, letterbox, run and read
//! back a batch, then start the next: the GPU's JPEG engines and its SMs would take turns.
//! [`Detector::each_decoded`] gives decoding threads of their own, one per device decoder, each
//! a batch ahead: each thread has its own CUDA stream (candle's per-thread default stream), so
//! nvJPEG and the letterbox of the next batches run beside the pass of the current one. The
//! decoding threads stay outside the activation arena (which serves the inference thread's
//! stream alone) and hand over only inputs that are complete on the device; the batches come
//! back in feed order.
//!
//! May use: the detector, the feed's [`Prepared`] pictures, the standard library.

use std::sync::mpsc::sync_channel;

use super::{DecodedJpegs, Detector};
use crate::vision::feed::{Picture, Prepared};
use crate::vision::preprocess::DecodeLimits;

/// Pictures per batch from which every device decoder gets a thread. Measured on an H200 (1080p
/// JPEGs, yolov9t, BENCHMARKS.md): at batch 1 one decoding thread streamed 630 img/s and two 309
/// (the pass itself slowed from 1.5 to 3.1 ms); from batch 8 up two streamed 1.1-1.2x one.
const MIN_BATCH_PER_EXTRA_DECODER: usize = 8;

impl Detector {
    /// Calls `each` with every batch of a feed, in order, and its JPEGs already on the device
    /// ([`Detector::decode_jpegs`] of the batch's pictures, those that are `Ok`, in order),
    /// decoded by one thread per device decoder (one thread for batches under 8 pictures), each a
    /// batch ahead; `each` passes them on to
    /// [`Detector::detect_pictures_decoded`] with the same pictures. Without a device decoder it
    /// is a plain loop, every batch with `None`.
    ///
    /// Stops at the first error, of `each` or of a decode (returned); the decoding threads then
    /// stop at their next batch and are joined before this returns. Each decoding thread holds
    /// at most three batches: one waiting for it, one it decodes, one decoded for `each`.
    pub fn each_decoded<I, F, E>(&self, batches: I, limits: &DecodeLimits, mut each: F) -> Result<(), E>
    where
        I: Iterator<Item = Vec<Prepared>> + Send,
        F: FnMut(Vec<Prepared>, Option<DecodedJpegs>) -> Result<(), E>,
        E: From<candle_core::Error>,
    {
        let lanes = self.device_jpeg_decoders();
        if lanes == 0 {
            for b in batches {
                each(b, None)?;
            }
            return Ok(());
        }
        // the first batch's size sets the threads: a small batch decodes in less time than its
        // pass takes, and more decoding threads would only compete with the pass
        let mut batches = batches.peekable();
        let first = batches.peek().map_or(0, |b| b.len());
        let threads = if first >= MIN_BATCH_PER_EXTRA_DECODER { lanes } else { 1 };
        // batch k goes to decoding thread k % threads and comes back from it: a dispatcher hands
        // the feed's batches out in turn, the caller takes the results in the same turn
        std::thread::scope(|s| {
            type Decoded = (Vec<Prepared>, candle_core::Result<Option<DecodedJpegs>>);
            let mut inputs = Vec::with_capacity(threads);
            let mut outputs = Vec::with_capacity(threads);
            for k in 0..threads {
                let (in_tx, in_rx) = sync_channel::<Vec<Prepared>>(1);
                let (out_tx, out_rx) = sync_channel::<Decoded>(1);
                std::thread::Builder::new()
                    .name(format!("jpeg-decode-{k}"))
                    .spawn_scoped(s, move || {
                        for b in in_rx {
                            let decoded = self.decode_jpegs(&pictures(&b), limits);
                            if out_tx.send((b, decoded)).is_err() {
                                break; // the caller stopped
                            }
                        }
                    })
                    .map_err(candle_core::Error::wrap)?;
                inputs.push(in_tx);
                outputs.push(out_rx);
            }
            std::thread::Builder::new()
                .name("jpeg-dispatch".into())
                .spawn_scoped(s, move || {
                    for (k, b) in batches.enumerate() {
                        if inputs[k % threads].send(b).is_err() {
                            break; // that decoding thread stopped
                        }
                    }
                })
                .map_err(candle_core::Error::wrap)?;
            // a closed channel in turn: the feed has ended (or a decoding thread stopped)
            for k in 0.. {
                let Ok((b, decoded)) = outputs[k % threads].recv() else { break };
                each(b, decoded?)?;
            }
            Ok(())
        })
    }
}

/// The pictures of a feed's batch that were read, in order.
fn pictures(batch: &[Prepared]) -> Vec<&Picture> {
    batch.iter().filter_map(|p| p.picture.as_ref().ok()).collect()
}
