// A CPU stand-in for the CUDA headers the project's kernels include, so that the harnesses here
// can run the kernels on the host: the kernel qualifiers compile away, the built-in thread
// coordinates are globals that `run` sets for every (block, thread) of a launch, the vector
// types have the device's sizes and layouts, and `__half` converts as the device does (IEEE
// binary16, round to nearest even). The fast-math `__expf` is the host's `expf` here: results
// are checked against the same arithmetic, not against the device's last bits.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __forceinline__ inline

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
inline Dim3 blockIdx, blockDim, gridDim, threadIdx;

// A launch: `k` for every (block, thread) of a grid of `blocks` x `threads`, one after the other.
inline void run(unsigned int blocks, unsigned int threads, const std::function<void()> &k) {
  gridDim.x = blocks;
  blockDim.x = threads;
  for (unsigned int b = 0; b < blocks; b++)
    for (unsigned int t = 0; t < threads; t++) {
      blockIdx.x = b;
      threadIdx.x = t;
      k();
    }
}

struct uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// a streaming (evict-first) load is a plain load on the host
template <typename T> inline T __ldcs(const T *p) { return *p; }

struct __half {
  uint16_t bits;
};
struct __half2 {
  __half x, y;
};
static_assert(sizeof(__half) == 2 && sizeof(__half2) == 4 && sizeof(uint4) == 16, "device sizes");

inline __half __float2half_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  const int exp = (x >> 23) & 0xff;
  if (exp == 0xff) return __half{(uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0))};
  const int e = exp - 127 + 15;
  if (e >= 0x1f) return __half{(uint16_t)(sign | 0x7c00)};
  if (e <= 0) {
    if (e < -10) return __half{sign};
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return __half{(uint16_t)(sign | h)};
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return __half{(uint16_t)(sign | h)};
}

inline float __half2float(__half v) {
  const uint16_t h = v.bits;
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      exp = 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        exp--;
      }
      x = sign | ((uint32_t)(exp + 127 - 15) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | ((uint32_t)(exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline float2 __half22float2(__half2 v) { return float2{__half2float(v.x), __half2float(v.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline float __expf(float v) { return std::exp(v); }
// launches are simulated one thread after another: no other thread can interleave
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) {
  const unsigned int old = *p;
  *p += v;
  return old;
}
