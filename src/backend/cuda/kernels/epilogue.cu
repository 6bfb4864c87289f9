// What follows every convolution of the model, in one pass over the activations:
//   out = act(y + bias[c]) (+ residual),  act = SiLU or identity,
// computed in f32 and rounded once (candle needs three kernels and three round trips through
// memory for this: broadcast add, silu, add). NCHW, contiguous; `hw` = H*W, `c` = channels.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/epilogue.rs.
#include "common.cuh"

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// act(y + b) (+ r) for two halves at once, rounded once.
__device__ __forceinline__ __half2 pair(__half2 y, float2 b, const __half2 *res, unsigned int i, int act, int has_res) {
  float2 v = __half22float2(y);
  v.x += b.x;
  v.y += b.y;
  if (act) {
    v.x = silu(v.x);
    v.y = silu(v.y);
  }
  if (has_res) {
    const float2 r = __half22float2(res[i]);
    v.x += r.x;
    v.y += r.y;
  }
  return __floats2half2_rn(v.x, v.y);
}

template <typename T>
__device__ void bias_act(const T *y, const T *bias, const T *res, T *out, unsigned int n, unsigned int hw,
                         unsigned int c, int act, int has_res) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    float v = ld(y[i]) + ld(bias[(i / hw) % c]);
    if (act) v = silu(v);
    if (has_res) v += ld(res[i]);
    out[i] = st<T>(v);
  }
}

extern "C" __global__ void bias_act_f32(const float *y, const float *bias, const float *res, float *out, unsigned int n,
                                        unsigned int hw, unsigned int c, int act, int has_res) {
  bias_act<float>(y, bias, res, out, n, hw, c, act, has_res);
}

extern "C" __global__ void bias_act_f16(const __half *y, const __half *bias, const __half *res, __half *out,
                                        unsigned int n, unsigned int hw, unsigned int c, int act, int has_res) {
  bias_act<__half>(y, bias, res, out, n, hw, c, act, has_res);
}

// Two halves per thread (H*W even, pointers 4-byte aligned): n2 = n/2 pairs, hw2 = hw/2.
extern "C" __global__ void bias_act_f16x2(const __half2 *y, const __half *bias, const __half2 *res, __half2 *out,
                                          unsigned int n2, unsigned int hw2, unsigned int c, int act, int has_res) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += blockDim.x * gridDim.x) {
    const float b = __half2float(bias[(i / hw2) % c]);
    out[i] = pair(y[i], make_float2(b, b), res, i, act, has_res);
  }
}

// Channels last (NHWC): element i has channel i % c (the kernels above with hw = 1 do the same
// one element at a time). Two halves per thread (C even, pointers 4-byte aligned): n2 = n/2
// pairs, c2 = C/2 bias pairs.
extern "C" __global__ void bias_act_cl_f16x2(const __half2 *y, const __half2 *bias, const __half2 *res, __half2 *out,
                                             unsigned int n2, unsigned int c2, int act, int has_res) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += blockDim.x * gridDim.x)
    out[i] = pair(y[i], __half22float2(bias[i % c2]), res, i, act, has_res);
}

// Eight halves per thread (one 16-byte load or store each), for channels last with C a multiple
// of 8 and 16-byte aligned pointers: n8 = n/8 units, c8 = C/8 bias units.
__device__ __forceinline__ uint4 eight(uint4 y, uint4 b, const uint4 *res, unsigned int i, int act, int has_res) {
  const __half2 *yh = reinterpret_cast<const __half2 *>(&y);
  const __half2 *bh = reinterpret_cast<const __half2 *>(&b);
  uint4 r = has_res ? res[i] : make_uint4(0, 0, 0, 0);
  const __half2 *rh = reinterpret_cast<const __half2 *>(&r);
  uint4 o;
  __half2 *oh = reinterpret_cast<__half2 *>(&o);
#pragma unroll
  for (int k = 0; k < 4; ++k) oh[k] = pair(yh[k], __half22float2(bh[k]), rh, k, act, has_res);
  return o;
}

extern "C" __global__ void bias_act_cl_f16x8(const uint4 *y, const uint4 *bias, const uint4 *res, uint4 *out,
                                             unsigned int n8, unsigned int c8, int act, int has_res) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += blockDim.x * gridDim.x)
    out[i] = eight(y[i], bias[i % c8], res, i, act, has_res);
}

// Channels last, into a channel slice of a wider buffer: the pixel's `c8` bias units go to
// units `off8 .. off8 + c8` of its row of `stride8` units (8 halves each), so that a
// concatenation's inputs are written in place by their producers. No residual.
extern "C" __global__ void bias_act_cl_f16x8_into(const uint4 *y, const uint4 *bias, uint4 *out, unsigned int n8,
                                                  unsigned int c8, unsigned int stride8, unsigned int off8, int act) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += blockDim.x * gridDim.x) {
    const unsigned int p = i / c8, ch = i - p * c8;
    out[(size_t)p * stride8 + off8 + ch] = eight(y[i], bias[ch], nullptr, i, act, 0);
  }
}
