// The letterbox on the device: decoded pictures (one per slot, each with its own size and row
// pitch) become the network's u8 input (B, H, W, 3), as src/vision/preprocess.rs `letterbox_fit`
// makes it on the host. Inside the resized region: OpenCV's INTER_LINEAR in fixed point, bit-exact
// with `resize_linear_cv` (horizontal pass in 11-bit weights as int, vertical pass
// `((h0>>4)*b0)>>16 + ((h1>>4)*b1)>>16`, `(+2)>>2`, clamped), from tap tables the host computes with
// the same `linear_taps`; a plain copy when the picture already has its new size; elsewhere, and in
// slots without a picture, the pad value 114. One thread per destination pixel (3 bytes).
//
// A picture is either RGB interleaved or the JPEG decoder's own planes: Y at full size and Cb, Cr
// at full size (4:4:4) or halved across (4:2:2), down (4:4:0) or both ways (4:2:0). The planes
// become RGB where the resize reads them, as libjpeg-turbo (the reference's decoder) makes them:
// its "fancy" upsampling (jdsample.c `h2v1_`, `h1v2_` and `h2v2_fancy_upsample`: 3/4 of the
// nearer chroma sample and 1/4 of the further one in each halved direction, the first and last
// row and column as it handles them) and its YCbCr to RGB conversion (jdcolor.c
// `ycc_rgb_convert`, 16-bit fixed point). Asking nvJPEG for the planes instead of RGB saves its
// conversion pass and 6 MB written per 1080p picture, and its chroma upsampling, up to 82 levels
// off libjpeg-turbo's on a photo.
//
// The decoded pictures are read with streaming loads (evict-first in L2): a 1080p picture is 6 MB,
// and read with plain loads it pushed the model's weights and activations out of L2, so that the
// pass right after it ran 0.04 ms longer at batch 1 (BENCHMARKS.md, GPU).
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/letterbox.rs.

// One slot, written by the host as 14 u64 words in this order (letterbox.rs `Letterboxer::run`).
struct Slot {
  unsigned long long src;       // offset of the picture's first row (RGB, or the Y plane) in `base`
  unsigned long long taps;      // device address of the int taps: 4 per new column, then 4 per new row
  unsigned long long pitch;     // bytes from one source row to the next (RGB, or the Y plane)
  unsigned long long sw, sh;    // source width and height
  unsigned long long nw, nh;    // resized width and height
  unsigned long long left, top; // where the resized picture starts in the input
  unsigned long long mode;      // 0: pad only, 1: copy (new size = source size), 2: resize
  unsigned long long cb, cr;    // offsets of the Cb and Cr planes (planar pictures)
  unsigned long long cpitch;    // bytes from one chroma row to the next; 0: RGB interleaved
  unsigned long long halved;    // chroma halved across (bit 0) and down (bit 1)
};

#define PAD 114

// Sample (x, y) of a chroma plane of `cw` x `ch` samples at the picture's full resolution; `h`, `v`:
// the plane is halved across, down (4:2:2 is `h` alone, 4:4:0 `v` alone, 4:2:0 both).
__device__ __forceinline__ int chroma(const unsigned char *p, size_t pitch, unsigned int cw, unsigned int ch, bool h,
                                      bool v, unsigned int x, unsigned int y) {
  const unsigned int j = h ? x >> 1 : x, i = v ? y >> 1 : y;
  const unsigned char *row = p + (size_t)i * pitch;
  // jdsample.c upsamples a plane halved across by repeating samples where it is 2 samples wide
  // or less
  if ((!h && !v) || (h && cw <= 2)) return __ldcs(row + j);
  // the neighbouring row: above for an even y, below for an odd one; the edge row repeated
  const unsigned int in = y & 1 ? (i + 1 < ch ? i + 1 : i) : (i > 0 ? i - 1 : 0);
  const unsigned char *near = p + (size_t)in * pitch;
  if (!h) return (3 * __ldcs(row + j) + __ldcs(near + j) + (y & 1 ? 2 : 1)) >> 2;
  // the neighbouring column: left of an even x, right of an odd one; none at the plane's ends
  const bool odd = x & 1;
  const bool end = odd ? j + 1 == cw : j == 0;
  const unsigned int jn = end ? j : (odd ? j + 1 : j - 1);
  if (!v) {
    const int c = __ldcs(row + j);
    return end ? c : (3 * c + __ldcs(row + jn) + (odd ? 2 : 1)) >> 2;
  }
  const int s = 3 * __ldcs(row + j) + __ldcs(near + j);
  if (end) return (4 * s + (odd ? 7 : 8)) >> 4;
  const int sn = 3 * __ldcs(row + jn) + __ldcs(near + jn);
  return (3 * s + sn + (odd ? 7 : 8)) >> 4;
}

__device__ __forceinline__ unsigned char clamp255(int v) { return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v)); }

// RGB of source pixel (x, y).
__device__ __forceinline__ void rgb(const unsigned char *base, const Slot &s, unsigned int x, unsigned int y,
                                    int out[3]) {
  if (s.cpitch == 0) {
    const unsigned char *q = base + s.src + (size_t)y * s.pitch + (size_t)x * 3;
    out[0] = __ldcs(q);
    out[1] = __ldcs(q + 1);
    out[2] = __ldcs(q + 2);
    return;
  }
  const bool h = s.halved & 1, v = s.halved & 2;
  const unsigned int cw = ((unsigned int)s.sw + h) >> h, ch = ((unsigned int)s.sh + v) >> v;
  const int Y = __ldcs(base + s.src + (size_t)y * s.pitch + x);
  const int cb = chroma(base + s.cb, s.cpitch, cw, ch, h, v, x, y) - 128;
  const int cr = chroma(base + s.cr, s.cpitch, cw, ch, h, v, x, y) - 128;
  // jdcolor.c: FIX(1.40200) = 91881, FIX(1.77200) = 116130, FIX(0.71414) = 46802,
  // FIX(0.34414) = 22554, ONE_HALF = 32768, SCALEBITS = 16 (arithmetic shifts)
  out[0] = clamp255(Y + ((91881 * cr + 32768) >> 16));
  out[1] = clamp255(Y + ((-22554 * cb + 32768 - 46802 * cr) >> 16));
  out[2] = clamp255(Y + ((116130 * cb + 32768) >> 16));
}

// Writes slots first..first+count of `out`; slots[k] describes slot first+k.
extern "C" __global__ void letterbox_u8(const unsigned char *base, const Slot *slots, unsigned int first,
                                        unsigned int count, unsigned int in_w, unsigned int in_h, unsigned char *out) {
  const unsigned int hw = in_w * in_h;
  const unsigned int total = count * hw;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned int k = i / hw, p = i % hw;
    const unsigned int y = p / in_w, x = p % in_w;
    const Slot s = slots[k];
    unsigned char *d = out + ((size_t)(first + k) * hw + p) * 3;
    if (s.mode == 0 || x < s.left || y < s.top || x - s.left >= s.nw || y - s.top >= s.nh) {
      d[0] = PAD;
      d[1] = PAD;
      d[2] = PAD;
      continue;
    }
    const unsigned int dx = x - (unsigned int)s.left, dy = y - (unsigned int)s.top;
    int q[3];
    if (s.mode == 1) {
      rgb(base, s, dx, dy, q);
      d[0] = (unsigned char)q[0];
      d[1] = (unsigned char)q[1];
      d[2] = (unsigned char)q[2];
      continue;
    }
    const int *xt = (const int *)s.taps + 4 * dx;
    const int *yt = (const int *)s.taps + 4 * (s.nw + dy);
    int q00[3], q01[3], q10[3], q11[3];
    rgb(base, s, xt[0], yt[0], q00);
    rgb(base, s, xt[1], yt[0], q01);
    rgb(base, s, xt[0], yt[1], q10);
    rgb(base, s, xt[1], yt[1], q11);
    const int w0 = xt[2], w1 = xt[3], b0 = yt[2], b1 = yt[3];
#pragma unroll
    for (int c = 0; c < 3; c++) {
      const int h0 = q00[c] * w0 + q01[c] * w1;
      const int h1 = q10[c] * w0 + q11[c] * w1;
      const int a = ((h0 >> 4) * b0) >> 16;
      const int b = ((h1 >> 4) * b1) >> 16;
      const int v = (a + b + 2) >> 2;
      d[c] = clamp255(v);
    }
  }
}
