// CBFuse on channels-last (NHWC) activations in one pass: out = base + up(s0) (+ up(s1)), where
// up() is nearest upsampling by an integer factor and s0/s1 are channel slices of CBLinear
// outputs (any strides: the slice's own). `out` may be `base` (in place): each element is read
// and written by the same thread. candle needs a strided copy, a broadcast copy and an add per
// source, at full resolution.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/fuse.rs.
#include "common.cuh"

// One source: element (b, y, x, c) of the output reads src[b*s.n + (y/f)*s.h + (x/f)*s.w + c*s.c].
struct Src {
  unsigned long long n, h, w, c;
  unsigned int f;
};

template <typename T>
__device__ __forceinline__ float up(const T *s, const Src &d, size_t b, unsigned int y, unsigned int x,
                                    unsigned int ch) {
  return ld(s[b * d.n + (size_t)(y / d.f) * d.h + (size_t)(x / d.f) * d.w + (size_t)ch * d.c]);
}

template <typename T>
__device__ void fuse(const T *base, T *out, const T *s0, Src d0, const T *s1, Src d1, int two, unsigned long long total,
                     unsigned int h, unsigned int w, unsigned int c) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)blockDim.x * gridDim.x) {
    const unsigned int ch = i % c;
    size_t r = i / c;
    const unsigned int x = r % w;
    r /= w;
    const unsigned int y = r % h;
    const size_t b = r / h;
    float v = ld(base[i]) + up(s0, d0, b, y, x, ch);
    if (two) v += up(s1, d1, b, y, x, ch);
    out[i] = st<T>(v);
  }
}

extern "C" __global__ void fuse_f16(const __half *base, __half *out, const __half *s0, Src d0, const __half *s1, Src d1,
                                    int two, unsigned long long total, unsigned int h, unsigned int w, unsigned int c) {
  fuse(base, out, s0, d0, s1, d1, two, total, h, w, c);
}

extern "C" __global__ void fuse_f32(const float *base, float *out, const float *s0, Src d0, const float *s1, Src d1,
                                    int two, unsigned long long total, unsigned int h, unsigned int w, unsigned int c) {
  fuse(base, out, s0, d0, s1, d1, two, total, h, w, c);
}
