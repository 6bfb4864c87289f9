// The detection head's decode in one pass per level, for channels-last (NHWC) branch outputs
// without their last convolutions' biases: for every anchor, those biases added (bb: 4*reg_max,
// cb: nc), the softmax over each side's reg_max bins and its expectation with the DFL
// weights (Distribution Focal Loss), the box from the anchor point (cell centre) as centre
// x/y, width, height in input pixels, and the sigmoid of every class logit, written into the
// reference's raw output (B, 4 + nc, total) at this level's anchors off..off + H*W (every level
// writes its own anchors of one buffer: no concatenation). candle needs about fifteen kernels
// and as many passes over the (B, 4*reg_max + nc, anchors) tensor for the same.
// f32 arithmetic, rounded once. One thread per (picture, anchor).
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/head.rs.
#include "common.cuh"

template <typename T>
__device__ void decode(const T *bx, const T *cl, const float *proj, const float *bb, const float *cb, T *out,
                       unsigned int n, unsigned int h, unsigned int w, unsigned int nc, unsigned int reg, float stride,
                       unsigned int total, unsigned int off) {
  const unsigned int an = h * w;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n * an; i += blockDim.x * gridDim.x) {
    const unsigned int b = i / an, a = i % an;
    const float ax = (float)(a % w) + 0.5f, ay = (float)(a / w) + 0.5f;
    const T *p = bx + (size_t)i * 4 * reg;
    float d[4];
    for (unsigned int s = 0; s < 4; s++) {
      float m = -INFINITY;
      for (unsigned int j = 0; j < reg; j++) m = fmaxf(m, ld(p[s * reg + j]) + bb[s * reg + j]);
      float sum = 0.0f, acc = 0.0f;
      for (unsigned int j = 0; j < reg; j++) {
        const float e = expf(ld(p[s * reg + j]) + bb[s * reg + j] - m);
        sum += e;
        acc += e * proj[j];
      }
      d[s] = acc / sum;
    }
    const float x1 = ax - d[0], y1 = ay - d[1], x2 = ax + d[2], y2 = ay + d[3];
    T *o = out + (size_t)b * (4 + nc) * total + off + a;
    o[0] = st<T>((x1 + x2) * 0.5f * stride);
    o[total] = st<T>((y1 + y2) * 0.5f * stride);
    o[2 * (size_t)total] = st<T>((x2 - x1) * stride);
    o[3 * (size_t)total] = st<T>((y2 - y1) * stride);
    const T *c = cl + (size_t)i * nc;
    for (unsigned int k = 0; k < nc; k++) o[(4 + (size_t)k) * total] = st<T>(1.0f / (1.0f + expf(-(ld(c[k]) + cb[k]))));
  }
}

extern "C" __global__ void decode_f16(const __half *bx, const __half *cl, const float *proj, const float *bb,
                                      const float *cb, __half *out, unsigned int n, unsigned int h, unsigned int w,
                                      unsigned int nc, unsigned int reg, float stride, unsigned int total,
                                      unsigned int off) {
  decode(bx, cl, proj, bb, cb, out, n, h, w, nc, reg, stride, total, off);
}

extern "C" __global__ void decode_f32(const float *bx, const float *cl, const float *proj, const float *bb,
                                      const float *cb, float *out, unsigned int n, unsigned int h, unsigned int w,
                                      unsigned int nc, unsigned int reg, float stride, unsigned int total,
                                      unsigned int off) {
  decode(bx, cl, proj, bb, cb, out, n, h, w, nc, reg, stride, total, off);
}
