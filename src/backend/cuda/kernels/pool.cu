// Pooling on channels-last (NHWC) activations, which candle's pooling (NCHW only) cannot do:
//   max: k x k window, stride s, padding p, padded cells ignored (PyTorch pads a max with -inf);
//   avg: k x k window, stride s, padding p, divided by k*k (count_include_pad=True).
// The input may be a channel slice: pixel (n, y, x) starts at ((n*h + y)*w + x)*cs, with cs >= c
// (the slice's offset is applied to the pointer). The output is contiguous (n, oh, ow, c).
// f32 arithmetic, rounded once. Consecutive threads take consecutive channels (coalesced); the
// f16 kernel for c and cs divisible by 8 moves 8 channels (16 bytes) per load.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/pool.rs.
#include "common.cuh"

template <typename T>
__device__ void pool(const T *x, T *y, unsigned int n_out, unsigned int h, unsigned int w, unsigned int c,
                     unsigned int cs, unsigned int oh, unsigned int ow, unsigned int k, unsigned int s, unsigned int p,
                     int is_max) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += blockDim.x * gridDim.x) {
    const unsigned int ch = i % c;
    unsigned int r = i / c;
    const unsigned int ox = r % ow;
    r /= ow;
    const unsigned int oy = r % oh;
    const unsigned int n = r / oh;
    const int y0 = (int)(oy * s) - (int)p, x0 = (int)(ox * s) - (int)p;
    float acc = is_max ? -INFINITY : 0.0f;
    for (int dy = 0; dy < (int)k; dy++) {
      const int yy = y0 + dy;
      if (yy < 0 || yy >= (int)h) continue;
      const T *row = x + ((size_t)n * h + yy) * w * cs;
      for (int dx = 0; dx < (int)k; dx++) {
        const int xx = x0 + dx;
        if (xx < 0 || xx >= (int)w) continue;
        const float v = ld(row[(size_t)xx * cs + ch]);
        acc = is_max ? fmaxf(acc, v) : acc + v;
      }
    }
    y[i] = st<T>(is_max ? acc : acc / (float)(k * k));
  }
}

extern "C" __global__ void pool_nhwc_f16(const __half *x, __half *y, unsigned int n_out, unsigned int h, unsigned int w,
                                         unsigned int c, unsigned int cs, unsigned int oh, unsigned int ow,
                                         unsigned int k, unsigned int s, unsigned int p, int is_max) {
  pool(x, y, n_out, h, w, c, cs, oh, ow, k, s, p, is_max);
}

extern "C" __global__ void pool_nhwc_f32(const float *x, float *y, unsigned int n_out, unsigned int h, unsigned int w,
                                         unsigned int c, unsigned int cs, unsigned int oh, unsigned int ow,
                                         unsigned int k, unsigned int s, unsigned int p, int is_max) {
  pool(x, y, n_out, h, w, c, cs, oh, ow, k, s, p, is_max);
}

// 8 channels per thread: n_out is the number of output elements / 8, c and cs divisible by 8,
// x and y 16-byte aligned.
extern "C" __global__ void pool_nhwc_f16x8(const __half *x, __half *y, unsigned int n_out, unsigned int h,
                                           unsigned int w, unsigned int c, unsigned int cs, unsigned int oh,
                                           unsigned int ow, unsigned int k, unsigned int s, unsigned int p,
                                           int is_max) {
  const unsigned int c8 = c / 8;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += blockDim.x * gridDim.x) {
    const unsigned int ch = (i % c8) * 8;
    unsigned int r = i / c8;
    const unsigned int ox = r % ow;
    r /= ow;
    const unsigned int oy = r % oh;
    const unsigned int n = r / oh;
    const int y0 = (int)(oy * s) - (int)p, x0 = (int)(ox * s) - (int)p;
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = is_max ? -INFINITY : 0.0f;
    for (int dy = 0; dy < (int)k; dy++) {
      const int yy = y0 + dy;
      if (yy < 0 || yy >= (int)h) continue;
      const __half *row = x + ((size_t)n * h + yy) * w * cs + ch;
      for (int dx = 0; dx < (int)k; dx++) {
        const int xx = x0 + dx;
        if (xx < 0 || xx >= (int)w) continue;
        const uint4 v = *reinterpret_cast<const uint4 *>(row + (size_t)xx * cs);
        const __half2 *hv = reinterpret_cast<const __half2 *>(&v);
        for (int j = 0; j < 4; j++) {
          const float2 f = __half22float2(hv[j]);
          if (is_max) {
            acc[2 * j] = fmaxf(acc[2 * j], f.x);
            acc[2 * j + 1] = fmaxf(acc[2 * j + 1], f.y);
          } else {
            acc[2 * j] += f.x;
            acc[2 * j + 1] += f.y;
          }
        }
      }
    }
    uint4 o;
    __half2 *ho = reinterpret_cast<__half2 *>(&o);
    const float d = is_max ? 1.0f : 1.0f / (float)(k * k);
    for (int j = 0; j < 4; j++) ho[j] = __floats2half2_rn(acc[2 * j] * d, acc[2 * j + 1] * d);
    *reinterpret_cast<uint4 *>(y + (size_t)i * 8) = o;
  }
}
