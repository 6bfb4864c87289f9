// The network input in one pass: letterboxed u8 pictures (B, H, W, 3), as uploaded, become the
// normalised input x / 255 in f16 or f32: NCHW (B, 3, H, W) for an NCHW model (`normalize_*`: one
// thread per pixel reads its three bytes and writes one element of each channel plane, coalesced
// per plane), or channels last (B, H, W, 3) for an NHWC one (`normalize_cl_*`: element for
// element). The division is done in f32 and rounded once, as torch's `im.half() / 255` does.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/input.rs.
#include "common.cuh"

template <typename T> __device__ void normalize(const unsigned char *x, unsigned int pixels, unsigned int hw, T *y) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += blockDim.x * gridDim.x) {
    const unsigned int n = i / hw, p = i % hw;
    const unsigned char *s = x + (size_t)i * 3;
    T *d = y + (size_t)n * 3 * hw + p;
    d[0] = st<T>((float)s[0] / 255.0f);
    d[hw] = st<T>((float)s[1] / 255.0f);
    d[2 * (size_t)hw] = st<T>((float)s[2] / 255.0f);
  }
}

extern "C" __global__ void normalize_f16(const unsigned char *x, unsigned int pixels, unsigned int hw, __half *y) {
  normalize(x, pixels, hw, y);
}
extern "C" __global__ void normalize_f32(const unsigned char *x, unsigned int pixels, unsigned int hw, float *y) {
  normalize(x, pixels, hw, y);
}

template <typename T> __device__ void normalize_cl(const unsigned char *x, unsigned int elems, T *y) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < elems; i += blockDim.x * gridDim.x)
    y[i] = st<T>((float)x[i] / 255.0f);
}

extern "C" __global__ void normalize_cl_f16(const unsigned char *x, unsigned int elems, __half *y) {
  normalize_cl(x, elems, y);
}
extern "C" __global__ void normalize_cl_f32(const unsigned char *x, unsigned int elems, float *y) {
  normalize_cl(x, elems, y);
}
