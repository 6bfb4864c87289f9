// A CPU stand-in for the CUDA headers the project's kernels include, so that `index_check.cpp`
// can run the kernels' index arithmetic on the host: the kernel qualifiers compile away, the
// built-in thread coordinates are globals the harness sets for every (block, thread) of a
// launch, and `uint4` is four 32-bit words, as on the device. `__half` is only a 16-bit box: the
// harness runs the f32 and byte instantiations, which share their index code with the f16 ones.
#pragma once
#include <cmath>
#include <cstdint>

#define __global__
#define __device__
#define __forceinline__ inline

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
extern Dim3 blockIdx, blockDim, gridDim, threadIdx;

struct uint4 {
  unsigned int x, y, z, w;
};

struct __half {
  uint16_t bits;
};
inline float __half2float(__half) { return NAN; }
inline __half __float2half_rn(float) { return __half{0x7e00}; }
