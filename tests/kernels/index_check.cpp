// The index arithmetic of the project's CUDA kernels, run on the host (`shim/cuda_fp16.h`
// stands in for CUDA): each launch is simulated for every (block, thread) of a small grid, so that
// the grid-stride loops split the work between threads, and the result is compared with a direct
// loop over the same tensors. Built and run by the `cuda_kernels_index_arithmetic` test
// (tests/model/kernels.rs); prints "ok" and exits 0 when every check holds.
#include <cstdio>
#include <functional>
#include <vector>

#include "cuda_fp16.h"
Dim3 blockIdx, blockDim, gridDim, threadIdx;
#include "head.cu"
#include "input.cu"
#include "nhwc.cu"

// every (block, thread) of a grid of `blocks` x `threads`, one after the other
static void run(unsigned int blocks, unsigned int threads, const std::function<void()> &k) {
  gridDim.x = blocks;
  blockDim.x = threads;
  for (unsigned int b = 0; b < blocks; b++)
    for (unsigned int t = 0; t < threads; t++) {
      blockIdx.x = b;
      threadIdx.x = t;
      k();
    }
}

static int fails = 0;
// the first failed check of a test is reported and ends that test
#define CHECK(c)                                                 \
  do {                                                           \
    if (!(c)) {                                                  \
      printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c);          \
      fails++;                                                   \
      return;                                                    \
    }                                                            \
  } while (0)

// copy_rows_x16 on f32 rows (4 channels per 16-byte unit): 12 channels at 8 of rows of 24 into
// channels 16.. of rows of 40; the destination's other channels stay untouched
void test_copy_rows() {
  const unsigned n = 2, h = 3, w = 5, cs = 24, c0 = 8, c = 12, wd = 40, off = 16;
  const unsigned rows = n * h * w;
  std::vector<float> src(rows * cs), dst(rows * wd, -1.f);
  for (size_t i = 0; i < src.size(); i++) src[i] = (float)i;
  run(3, 7, [&] { copy_rows_x16((const uint4 *)(src.data() + c0), (uint4 *)(dst.data() + off), rows, c / 4, cs / 4, wd / 4); });
  for (unsigned p = 0; p < rows; p++)
    for (unsigned k = 0; k < wd; k++) {
      float want = (k >= off && k < off + c) ? src[p * cs + c0 + (k - off)] : -1.f;
      CHECK(dst[p * wd + k] == want);
    }
}
void test_upsample() {
  const unsigned n = 2, ih = 3, iw = 4, c = 8, fh = 2, fw = 3;
  std::vector<float> src(n * ih * iw * c), dst(n * ih * fh * iw * fw * c, -1.f);
  for (size_t i = 0; i < src.size(); i++) src[i] = (float)i;
  run(5, 3, [&] { upsample_x16((const uint4 *)src.data(), (uint4 *)dst.data(), n, ih, iw, fh, fw, c / 4); });
  for (unsigned b = 0; b < n; b++) for (unsigned y = 0; y < ih * fh; y++) for (unsigned x = 0; x < iw * fw; x++) for (unsigned k = 0; k < c; k++)
    CHECK(dst[((b * ih * fh + y) * iw * fw + x) * c + k] == src[((b * ih + y / fh) * iw + x / fw) * c + k]);
}
void test_to_nhwc() {
  const unsigned n = 3, c = 3, h = 4, w = 7;
  std::vector<float> src(n * c * h * w), dst(n * c * h * w, -1.f);
  for (size_t i = 0; i < src.size(); i++) src[i] = (float)i;
  run(2, 5, [&] { to_nhwc_f32(src.data(), dst.data(), n * h * w, h * w, c); });
  for (unsigned b = 0; b < n; b++) for (unsigned y = 0; y < h; y++) for (unsigned x = 0; x < w; x++) for (unsigned k = 0; k < c; k++)
    CHECK(dst[((b * h + y) * w + x) * c + k] == src[((b * c + k) * h + y) * w + x]);
}
void test_normalize_cl() {
  std::vector<unsigned char> x(2 * 3 * 5 * 3);
  for (size_t i = 0; i < x.size(); i++) x[i] = (unsigned char)(i * 7);
  std::vector<float> y(x.size(), -1.f);
  run(2, 4, [&] { normalize_cl_f32(x.data(), (unsigned)x.size(), y.data()); });
  for (size_t i = 0; i < x.size(); i++) CHECK(y[i] == (float)x[i] / 255.0f);
}
// decode: two levels written into their anchors of one output, against a direct computation;
// every element of the output is written by one of them
void test_decode() {
  const unsigned n = 2, nc = 3, reg = 4;
  const unsigned hs[2] = {4, 2}, ws[2] = {6, 3};
  const float strides[2] = {8.f, 16.f};
  const unsigned total = 4 * 6 + 2 * 3;
  std::vector<float> proj(reg);
  for (unsigned j = 0; j < reg; j++) proj[j] = (float)j;
  std::vector<float> out(n * (4 + nc) * total, NAN);
  unsigned off = 0;
  std::vector<std::vector<float>> bxs, cls;
  for (int l = 0; l < 2; l++) {
    unsigned h = hs[l], w = ws[l];
    std::vector<float> bx(n * h * w * 4 * reg), cl(n * h * w * nc);
    for (size_t i = 0; i < bx.size(); i++) bx[i] = std::sin((float)i + l);
    for (size_t i = 0; i < cl.size(); i++) cl[i] = std::cos((float)i * 0.3f + l);
    run(3, 2, [&] { decode_f32(bx.data(), cl.data(), proj.data(), out.data(), n, h, w, nc, reg, strides[l], total, off); });
    for (unsigned b = 0; b < n; b++) for (unsigned a = 0; a < h * w; a++) {
      const float *p = &bx[(b * h * w + a) * 4 * reg];
      float d[4];
      for (int s = 0; s < 4; s++) { float m = -1e30f; for (unsigned j = 0; j < reg; j++) m = std::fmax(m, p[s * reg + j]); float sum = 0, acc = 0; for (unsigned j = 0; j < reg; j++) { float e = std::exp(p[s * reg + j] - m); sum += e; acc += e * proj[j]; } d[s] = acc / sum; }
      float ax = (a % w) + 0.5f, ay = (a / w) + 0.5f;
      float x1 = ax - d[0], y1 = ay - d[1], x2 = ax + d[2], y2 = ay + d[3];
      float want[4] = {(x1 + x2) * 0.5f * strides[l], (y1 + y2) * 0.5f * strides[l], (x2 - x1) * strides[l], (y2 - y1) * strides[l]};
      for (int r = 0; r < 4; r++) CHECK(std::fabs(out[(b * (4 + nc) + r) * total + off + a] - want[r]) < 1e-5f);
      for (unsigned k = 0; k < nc; k++) CHECK(std::fabs(out[(b * (4 + nc) + 4 + k) * total + off + a] - 1.f / (1.f + std::exp(-cl[(b * h * w + a) * nc + k]))) < 1e-6f);
    }
    off += h * w;
  }
  for (float v : out) CHECK(!std::isnan(v));
}
int main() {
  test_copy_rows();
  test_upsample();
  test_to_nhwc();
  test_normalize_cl();
  test_decode();
  printf("%s (%d failures)\n", fails ? "FAILED" : "ok", fails);
  return fails != 0;
}
