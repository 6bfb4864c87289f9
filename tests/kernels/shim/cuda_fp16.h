// A CPU stand-in for the CUDA headers the project's kernels include, so that the harnesses here
// can run the kernels on the host: the kernel qualifiers compile away, the built-in thread
// coordinates are per-thread globals that `run` sets for every (block, thread) of a launch, the
// vector types have the device's sizes and layouts, and `__half` converts as the device does
// (IEEE binary16, round to nearest even). The fast-math `__expf` is the host's `expf` here:
// results are checked against the same arithmetic, not against the device's last bits. Kernels
// with shared memory and barriers run through `run_threads`: a host thread for every thread of
// a block, meeting at `__syncthreads`, with `__shared__` variables as statics (one block at a
// time uses them).
#pragma once
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(threads)

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
inline thread_local Dim3 blockIdx, blockDim, gridDim, threadIdx;

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
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned int atomicOr(unsigned int *p, unsigned int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline int __ffs(unsigned int v) { return __builtin_ffs((int)v); }
inline unsigned int __float_as_uint(float v) {
  unsigned int u;
  std::memcpy(&u, &v, 4);
  return u;
}
// the host's IEEE operations, each rounded to nearest (harnesses build with -ffp-contract=off)
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
using std::isfinite;

// The barrier of the block that `run_threads` runs.
struct BlockBarrier {
  std::mutex m;
  std::condition_variable cv;
  unsigned int threads, waiting = 0, generation = 0;
  void wait() {
    std::unique_lock<std::mutex> l(m);
    const unsigned int g = generation;
    if (++waiting == threads) {
      waiting = 0;
      generation++;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return generation != g; });
    }
  }
};
inline BlockBarrier *block_barrier = nullptr;
inline void __syncthreads() { block_barrier->wait(); }

// A launch of a kernel with shared memory and barriers: the blocks one after another, each
// block's `threads` as host threads.
inline void run_threads(unsigned int blocks, unsigned int threads, const std::function<void()> &k) {
  for (unsigned int b = 0; b < blocks; b++) {
    BlockBarrier bar;
    bar.threads = threads;
    block_barrier = &bar;
    std::vector<std::thread> pool;
    for (unsigned int t = 0; t < threads; t++)
      pool.emplace_back([&, b, t] {
        gridDim.x = blocks;
        blockDim.x = threads;
        blockIdx.x = b;
        threadIdx.x = t;
        k();
      });
    for (auto &t : pool) t.join();
    block_barrier = nullptr;
  }
}
