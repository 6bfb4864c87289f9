// Data movement on channels-last (NHWC) activations. candle moves these one element per thread
// through its generic strided copy; here:
//   copy_rows_x16: rows of 16-byte units between two row strides (a channel slice made
//     contiguous, a tensor written into channels of a wider one). Row p of the source starts at
//     unit p * src_stride, of the destination at p * dst_stride (the channel offsets are applied
//     to the pointers);
//   upsample_x16: nearest-neighbour upsampling by integer factors fh x fw, 16 bytes per thread;
//   to_nhwc: the network input (B, C, H, W) laid out as (B, H, W, C), one thread per pixel
//     (reads coalesced per channel plane, writes the pixel's C neighbouring elements).
// The 16-byte kernels move bytes: they serve f16 (8 channels per unit) and f32 (4) alike.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/nhwc.rs.
#include "common.cuh"

extern "C" __global__ void copy_rows_x16(const uint4 *src, uint4 *dst, unsigned int rows, unsigned int units,
                                         unsigned int src_stride, unsigned int dst_stride) {
  const unsigned int total = rows * units;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned int p = i / units, k = i % units;
    dst[(size_t)p * dst_stride + k] = src[(size_t)p * src_stride + k];
  }
}

extern "C" __global__ void upsample_x16(const uint4 *src, uint4 *dst, unsigned int n, unsigned int ih, unsigned int iw,
                                        unsigned int fh, unsigned int fw, unsigned int units) {
  const unsigned int oh = ih * fh, ow = iw * fw;
  const unsigned int total = n * oh * ow * units;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned int k = i % units;
    unsigned int r = i / units;
    const unsigned int ox = r % ow;
    r /= ow;
    const unsigned int oy = r % oh;
    const unsigned int b = r / oh;
    dst[i] = src[(((size_t)b * ih + oy / fh) * iw + ox / fw) * units + k];
  }
}

template <typename T> __device__ void to_nhwc(const T *x, T *y, unsigned int pixels, unsigned int hw, unsigned int c) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += blockDim.x * gridDim.x) {
    const unsigned int b = i / hw, p = i % hw;
    const T *s = x + (size_t)b * c * hw + p;
    T *d = y + (size_t)i * c;
    for (unsigned int ch = 0; ch < c; ch++) d[ch] = s[(size_t)ch * hw];
  }
}

extern "C" __global__ void to_nhwc_f16(const __half *x, __half *y, unsigned int pixels, unsigned int hw,
                                       unsigned int c) {
  to_nhwc(x, y, pixels, hw, c);
}

extern "C" __global__ void to_nhwc_f32(const float *x, float *y, unsigned int pixels, unsigned int hw, unsigned int c) {
  to_nhwc(x, y, pixels, hw, c);
}
