// The letterbox on the device: decoded RGB pictures (one per slot, each with its own size and row
// pitch) become the network's u8 input (B, H, W, 3), as src/vision/preprocess.rs `letterbox_fit`
// makes it on the host. Inside the resized region: OpenCV's INTER_LINEAR in fixed point, bit-exact
// with `resize_linear_cv` (horizontal pass in 11-bit weights as int, vertical pass
// `((h0>>4)*b0)>>16 + ((h1>>4)*b1)>>16`, `(+2)>>2`, clamped), from tap tables the host computes with
// the same `linear_taps`; a plain copy when the picture already has its new size; elsewhere, and in
// slots without a picture, the pad value 114. One thread per destination pixel (3 bytes).
// The decoded pictures are read once, with streaming loads (evict-first in L2): a 1080p picture
// is 6 MB, and read with plain loads it pushed the model's weights and activations out of L2, so
// that the pass right after it ran 0.04 ms longer at batch 1 (BENCHMARKS.md, GPU).
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/letterbox.rs.

// One slot, written by the host as 10 u64 words in this order (letterbox.rs `Slot::words`).
struct Slot {
  unsigned long long src;       // offset of the picture's first row (RGB interleaved) in `base`
  unsigned long long taps;      // device address of the int taps: 4 per new column, then 4 per new row
  unsigned long long pitch;     // bytes from one source row to the next
  unsigned long long sw, sh;    // source width and height
  unsigned long long nw, nh;    // resized width and height
  unsigned long long left, top; // where the resized picture starts in the input
  unsigned long long mode;      // 0: pad only, 1: copy (new size = source size), 2: resize
};

#define PAD 114

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
    const size_t dx = x - s.left, dy = y - s.top;
    const unsigned char *src = base + s.src;
    if (s.mode == 1) {
      const unsigned char *q = src + dy * s.pitch + dx * 3;
      d[0] = __ldcs(q);
      d[1] = __ldcs(q + 1);
      d[2] = __ldcs(q + 2);
      continue;
    }
    const int *xt = (const int *)s.taps + 4 * dx;
    const int *yt = (const int *)s.taps + 4 * (s.nw + dy);
    const unsigned char *r0 = src + (size_t)yt[0] * s.pitch;
    const unsigned char *r1 = src + (size_t)yt[1] * s.pitch;
    const size_t c0 = (size_t)xt[0] * 3, c1 = (size_t)xt[1] * 3;
    const int w0 = xt[2], w1 = xt[3], b0 = yt[2], b1 = yt[3];
#pragma unroll
    for (int c = 0; c < 3; c++) {
      const int h0 = (int)__ldcs(r0 + c0 + c) * w0 + (int)__ldcs(r0 + c1 + c) * w1;
      const int h1 = (int)__ldcs(r1 + c0 + c) * w0 + (int)__ldcs(r1 + c1 + c) * w1;
      const int a = ((h0 >> 4) * b0) >> 16;
      const int b = ((h1 >> 4) * b1) >> 16;
      const int v = (a + b + 2) >> 2;
      d[c] = (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
}
