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
    /// batch ahead; `each` passes them on to [`Detector::detect_pictures_decoded`] with the same
    /// pictures. Without a device decoder it is a plain loop, every batch with `None`.
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
        in_turn(
            threads,
            batches,
            |b| self.decode_jpegs(&pictures(b), limits),
            |b, decoded| each(b, decoded?),
            |e| E::from(candle_core::Error::wrap(e)),
        )
    }
}

/// Runs `work` on every item of `items` on `threads` threads of its own and `each` on the
/// results, on the calling thread, in the items' order: item `k` goes to thread `k % threads`
/// (a dispatcher thread hands them out in turn) and its result is taken from that thread in the
/// same turn. Each thread holds at most three items: one waiting for it, one it works on, one
/// done. Stops at `each`'s first error (returned); the threads then stop at their next item and
/// are joined before this returns. `spawn_error`: a thread that could not be started.
fn in_turn<T, R, E>(
    threads: usize,
    items: impl Iterator<Item = T> + Send,
    work: impl Fn(&T) -> R + Sync,
    mut each: impl FnMut(T, R) -> Result<(), E>,
    spawn_error: impl Fn(std::io::Error) -> E,
) -> Result<(), E>
where
    T: Send,
    R: Send,
{
    let threads = threads.max(1);
    std::thread::scope(|s| {
        let work = &work;
        let mut inputs = Vec::with_capacity(threads);
        let mut outputs = Vec::with_capacity(threads);
        for k in 0..threads {
            let (in_tx, in_rx) = sync_channel::<T>(1);
            let (out_tx, out_rx) = sync_channel::<(T, R)>(1);
            std::thread::Builder::new()
                .name(format!("jpeg-decode-{k}"))
                .spawn_scoped(s, move || {
                    for item in in_rx {
                        let r = work(&item);
                        if out_tx.send((item, r)).is_err() {
                            break; // the caller stopped
                        }
                    }
                })
                .map_err(&spawn_error)?;
            inputs.push(in_tx);
            outputs.push(out_rx);
        }
        std::thread::Builder::new()
            .name("jpeg-dispatch".into())
            .spawn_scoped(s, move || {
                for (k, item) in items.enumerate() {
                    if inputs[k % threads].send(item).is_err() {
                        break; // that thread stopped
                    }
                }
            })
            .map_err(&spawn_error)?;
        // a closed channel in turn: the items have ended
        for k in 0.. {
            let Ok((item, r)) = outputs[k % threads].recv() else { break };
            each(item, r)?;
        }
        Ok(())
    })
}

/// The pictures of a feed's batch that were read, in order.
fn pictures(batch: &[Prepared]) -> Vec<&Picture> {
    batch.iter().filter_map(|p| p.picture.as_ref().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::in_turn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Work that takes longer for some items than others, so that threads finish out of turn.
    fn slow(k: &usize) -> usize {
        std::thread::sleep(Duration::from_micros(((k * 7919) % 5) as u64 * 300));
        k * 10
    }

    #[test]
    fn results_come_in_item_order_whatever_the_threads() {
        for threads in [1, 2, 3, 5] {
            let mut seen = Vec::new();
            in_turn(
                threads,
                0..40usize,
                slow,
                |k, r| -> Result<(), String> {
                    assert_eq!(r, k * 10);
                    seen.push(k);
                    Ok(())
                },
                |e| e.to_string(),
            )
            .unwrap();
            assert_eq!(seen, (0..40).collect::<Vec<_>>(), "{threads} threads");
        }
        // no items: no call
        in_turn(2, std::iter::empty::<usize>(), slow, |_, _| -> Result<(), String> { panic!("no items") }, |e| e.to_string()).unwrap();
    }

    #[test]
    fn the_first_error_stops_the_items_within_a_bound() {
        for threads in [1, 2, 4] {
            let taken = AtomicUsize::new(0);
            let items = (0..10_000usize).inspect(|_| {
                taken.fetch_add(1, Ordering::Relaxed);
            });
            let mut calls = 0;
            let r = in_turn(
                threads,
                items,
                slow,
                |k, _| {
                    calls += 1;
                    if k == 5 {
                        return Err(format!("stop at {k}"));
                    }
                    Ok(())
                },
                |e| e.to_string(),
            );
            assert_eq!(r, Err("stop at 5".to_string()));
            assert_eq!(calls, 6);
            // 6 handed to the caller, at most 3 per thread in flight, and the dispatcher's next
            let taken = taken.load(Ordering::Relaxed);
            assert!(taken <= 6 + 3 * threads + 1, "{threads} threads took {taken} items");
        }
    }
}
