//! The letterbox on CUDA in one launch per batch (`kernels/letterbox.cu`): decoded pictures
//! already on the device, each with its own size and row pitch, become the u8 network input
//! `(B, H, W, 3)`, bit-exact with the host's `letterbox_fit` (OpenCV INTER_LINEAR in fixed point,
//! pad 114). A picture is RGB interleaved, or a JPEG decoder's Y, Cb and Cr planes, which the
//! kernel turns into RGB as libjpeg-turbo does (`tests/kernels/letterbox_jpeg_check.cpp` checks it
//! against libjpeg-turbo itself).
//!
//! The tap tables (source index and weights per destination column and row) are computed on the
//! host by the same `linear_taps` the host resize uses, uploaded once per picture shape and kept
//! (a bounded cache). Each launch's slot table is written into page-locked memory and copied on
//! the stream into a device table, both kept: a copy from pageable memory would wait for all the
//! work queued on the stream before it (a pass of the model already running).

use std::collections::HashMap;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::CudaDevice;

use crate::vision::preprocess::{linear_taps, LetterboxGeometry};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/letterbox.ptx"));
const MODULE: &str = "yolo_edge_letterbox";

/// Tap tables kept at most; past it the cache starts again (each table is a few kB).
const MAX_TAP_SHAPES: usize = 256;

/// u64 words per slot in the launch's table (`struct Slot` in `kernels/letterbox.cu`).
const SLOT_WORDS: usize = 14;

/// A decoded picture in the source buffer: `h` rows, `pitch` bytes apart, from byte `offset`, of
/// `w` pixels RGB interleaved (`w * 3` bytes), or of `w` Y samples where `chroma` is set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source {
    pub offset: usize,
    pub pitch: usize,
    pub w: u32,
    pub h: u32,
    pub chroma: Option<Chroma>,
}

/// The Cb and Cr planes of a planar picture, each of [`Chroma::size`] samples, rows `pitch` bytes
/// apart, from byte `cb` and `cr` of the source buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chroma {
    pub cb: usize,
    pub cr: usize,
    pub pitch: usize,
    pub sampling: Sampling,
}

/// How a JPEG's chroma planes are sampled against its Y plane: the ones the device letterbox
/// upsamples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sampling {
    /// 4:4:4: full size.
    Full,
    /// 4:2:2: halved across.
    Across,
    /// 4:4:0: halved down.
    Down,
    /// 4:2:0: halved both ways.
    Both,
}

impl Sampling {
    /// The sampling whose chroma planes are `cw` x `ch` for a `w` x `h` picture (a halved side
    /// rounded up), if any.
    pub fn of(w: u32, h: u32, (cw, ch): (u32, u32)) -> Option<Self> {
        let halved = |full: u32, c: u32| match c {
            _ if c == full => Some(false),
            _ if c == full.div_ceil(2) => Some(true),
            _ => None,
        };
        Some(match (halved(w, cw)?, halved(h, ch)?) {
            (false, false) => Sampling::Full,
            (true, false) => Sampling::Across,
            (false, true) => Sampling::Down,
            (true, true) => Sampling::Both,
        })
    }

    /// Bit 0: halved across; bit 1: halved down (`Slot::halved` in the kernel).
    fn bits(self) -> u64 {
        match self {
            Sampling::Full => 0,
            Sampling::Across => 1,
            Sampling::Down => 2,
            Sampling::Both => 3,
        }
    }

    /// Samples across and down of a `w` x `h` picture's chroma planes.
    pub fn size(self, w: u32, h: u32) -> (u32, u32) {
        let b = self.bits();
        (if b & 1 == 1 { w.div_ceil(2) } else { w }, if b & 2 == 2 { h.div_ceil(2) } else { h })
    }
}

/// Tap tables on the device per (source width, height, new width, height), and the slot table.
#[derive(Default)]
pub(crate) struct Letterboxer {
    taps: HashMap<(u32, u32, u32, u32), CudaSlice<i32>>,
    table: Option<SlotTable>,
}

/// The launch's slot table: written on the host into `host` (page-locked), copied on the stream
/// into `dev`; both as long, grown and never shrunk. cudarc orders the uses of `host`: a write
/// waits for the copy out of it before (`as_mut_slice`), and so does freeing it. The next copy
/// into `dev` is queued after the launch that read it.
struct SlotTable {
    host: PinnedHostSlice<u64>,
    dev: CudaSlice<u64>,
}

impl Letterboxer {
    /// Writes slots `first..first + slots.len()` of `out` (u8 `(B, in_h, in_w, 3)`, contiguous):
    /// slot `first + k` from `slots[k]`, a picture of `base` placed by its geometry, or the pad
    /// value where `None`. Every geometry must be of an `in_w` x `in_h` input and every source
    /// inside `base`: checked here, before anything is launched.
    pub fn run(
        &mut self,
        dev: &CudaDevice,
        base: &CudaSlice<u8>,
        slots: &[Option<(Source, LetterboxGeometry)>],
        first: usize,
        (in_w, in_h): (u32, u32),
        out: &mut CudaSlice<u8>,
    ) -> candle_core::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let hw = (in_w as usize).checked_mul(in_h as usize).filter(|&v| v > 0);
        let pixels = hw.and_then(|hw| hw.checked_mul(slots.len()));
        let end = hw.and_then(|hw| hw.checked_mul(first.checked_add(slots.len())?)?.checked_mul(3));
        let (Some(pixels), Some(end)) = (pixels, end) else {
            candle_core::bail!("letterbox: {} slots of {in_w}x{in_h} is not a valid input", slots.len());
        };
        if end > out.len() || pixels > u32::MAX as usize || first > u32::MAX as usize {
            candle_core::bail!("letterbox: slots {first}..{} of {in_w}x{in_h} do not fit the output", first + slots.len());
        }
        if self.taps.len() > MAX_TAP_SHAPES {
            self.taps.clear(); // freed in stream order, after the launches that read them
        }
        let stream = dev.cuda_stream();
        let mut table = Vec::with_capacity(slots.len() * SLOT_WORDS);
        for (k, slot) in slots.iter().enumerate() {
            let Some((src, g)) = slot else {
                table.extend_from_slice(&[0; SLOT_WORDS]);
                continue;
            };
            check_slot(src, g, (in_w, in_h), base.len())
                .map_err(|e| candle_core::Error::Msg(format!("letterbox: slot {}: {e}", first + k)))?;
            let copy = (g.new_w, g.new_h) == (src.w, src.h);
            let taps = if copy {
                0
            } else {
                let key = (src.w, src.h, g.new_w, g.new_h);
                let t = match self.taps.entry(key) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(dev.clone_htod(&tap_table(src.w, src.h, g.new_w, g.new_h)?)?),
                };
                let (ptr, _record) = t.device_ptr(&stream);
                ptr
            };
            let (cb, cr, cpitch, halved) =
                src.chroma.map_or((0, 0, 0, 0), |c| (c.cb as u64, c.cr as u64, c.pitch as u64, c.sampling.bits()));
            table.extend_from_slice(&[
                src.offset as u64,
                taps,
                src.pitch as u64,
                src.w.into(),
                src.h.into(),
                g.new_w.into(),
                g.new_h.into(),
                g.left.into(),
                g.top.into(),
                if copy { 1 } else { 2 },
                cb,
                cr,
                cpitch,
                halved,
            ]);
        }
        if self.table.as_ref().is_none_or(|t| t.host.len() < table.len()) {
            self.table = None; // the old buffers are freed after their last copy
            let words = table.len().next_power_of_two().max(64 * SLOT_WORDS);
            // SAFETY: page-locked host memory of `words` u64, all zeroed before any other use.
            let mut host = unsafe { stream.context().alloc_pinned::<u64>(words) }.w()?;
            host.as_mut_slice().w()?.fill(0);
            // SAFETY: every copy into it is of the whole host buffer, as long, so all of it is
            // written before a launch reads it.
            let dev_table = unsafe { stream.alloc::<u64>(words) }.w()?;
            self.table = Some(SlotTable { host, dev: dev_table });
        }
        let t = self.table.as_mut().expect("slot table allocated above");
        t.host.as_mut_slice().w()?[..table.len()].copy_from_slice(&table);
        stream.memcpy_htod(&t.host, &mut t.dev).w()?;
        let table = &t.dev;
        let func = dev.get_or_load_custom_func("letterbox_u8", MODULE, PTX)?;
        let cfg = super::grid(pixels, 256);
        let (first, count) = (first as u32, slots.len() as u32);
        let mut builder = func.builder();
        builder.arg(base);
        builder.arg(table);
        builder.arg(&first);
        builder.arg(&count);
        builder.arg(&in_w);
        builder.arg(&in_h);
        builder.arg(out);
        // SAFETY: argument list matches `kernels/letterbox.cu`; `table` holds SLOT_WORDS words per
        // slot in `struct Slot`'s order; every source region lies inside `base` and every tap
        // indexes inside its source (`check_slot`, `linear_taps` clamps to the last row and
        // column); the tap tables stay alive in `self.taps` until a later call clears them, which
        // frees them in stream order; the output holds slots `first..first + count` (checked above).
        unsafe { builder.launch(cfg) }.w()?;
        Ok(())
    }
}

/// Whether `src` placed by `g` is a picture of `base` (`base_len` bytes) inside the input.
fn check_slot(src: &Source, g: &LetterboxGeometry, (in_w, in_h): (u32, u32), base_len: usize) -> Result<(), String> {
    if (g.in_w, g.in_h) != (in_w, in_h) {
        return Err(format!("geometry of a {}x{} input in a batch of {in_w}x{in_h}", g.in_w, g.in_h));
    }
    if (g.orig_w, g.orig_h) != (src.w, src.h) || src.w == 0 || src.h == 0 {
        return Err(format!("geometry of a {}x{} picture for a {}x{} source", g.orig_w, g.orig_h, src.w, src.h));
    }
    if g.new_w == 0
        || g.new_h == 0
        || g.left.checked_add(g.new_w).is_none_or(|r| r > in_w)
        || g.top.checked_add(g.new_h).is_none_or(|b| b > in_h)
    {
        return Err(format!("resized region {}x{} at ({}, {}) outside the input", g.new_w, g.new_h, g.left, g.top));
    }
    let row = if src.chroma.is_some() { Some(src.w as usize) } else { (src.w as usize).checked_mul(3) };
    let row = row.ok_or("row size overflows")?;
    if !plane_inside(src.offset, src.pitch, row, src.h as usize, base_len) {
        return Err(format!("source {}x{} (pitch {}, offset {}) outside its {base_len}-byte buffer", src.w, src.h, src.pitch, src.offset));
    }
    if let Some(c) = src.chroma {
        let (cw, ch) = c.sampling.size(src.w, src.h);
        for (name, at) in [("Cb", c.cb), ("Cr", c.cr)] {
            if !plane_inside(at, c.pitch, cw as usize, ch as usize, base_len) {
                return Err(format!("{name} plane {cw}x{ch} (pitch {}, offset {at}) outside its {base_len}-byte buffer", c.pitch));
            }
        }
    }
    Ok(())
}

/// Whether `rows` rows of `row` bytes, `pitch` apart from byte `offset`, lie in `len` bytes.
fn plane_inside(offset: usize, pitch: usize, row: usize, rows: usize, len: usize) -> bool {
    let end = rows.checked_sub(1).and_then(|r| r.checked_mul(pitch)).and_then(|v| v.checked_add(row)?.checked_add(offset));
    pitch >= row && end.is_some_and(|e| e <= len)
}

/// `(s0, s1, w0, w1)` per new column, then per new row, as the host resize computes them.
fn tap_table(sw: u32, sh: u32, nw: u32, nh: u32) -> candle_core::Result<Vec<i32>> {
    let x = linear_taps(nw as usize, sw as usize, true);
    let y = linear_taps(nh as usize, sh as usize, false);
    let mut t = Vec::with_capacity((x.len() + y.len()) * 4);
    for (s0, s1, w0, w1) in x.into_iter().chain(y) {
        let (Ok(s0), Ok(s1)) = (i32::try_from(s0), i32::try_from(s1)) else {
            candle_core::bail!("letterbox: a {sw}x{sh} source is too large for the kernel's taps");
        };
        t.extend_from_slice(&[s0, s1, w0, w1]);
    }
    Ok(t)
}
