// The project's CUDA kernels run on the host (`shim/cuda_fp16.h` stands in for CUDA): each launch
// is simulated for every (block, thread) of a small grid, so that the grid-stride loops split the
// work between threads, and the result is compared with a direct loop over the same tensors in
// the same arithmetic (f32, rounded once to f16 where the kernel stores f16). What this checks is
// the indexing, the vector loads and stores and the order of the arithmetic; the device's own
// rounding of `__expf` is checked by the parity steps on the GPU. Built and run by the
// `cuda_kernels_on_the_cpu` test (tests/model/kernels.rs); prints "ok" and exits 0 when every
// check holds.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "candidates.cu"
#include "cuda_fp16.h"
#include "epilogue.cu"
#include "fuse.cu"
#include "head.cu"
#include "input.cu"
#include "nhwc.cu"
#include "pool.cu"

static int fails = 0;
// the first failed check of a test is reported and ends that test
#define CHECK(c)                                                                                                       \
  do {                                                                                                                 \
    if (!(c)) {                                                                                                        \
      printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c);                                                               \
      fails++;                                                                                                         \
      return;                                                                                                          \
    }                                                                                                                  \
  } while (0)

// copy_rows_x16 on f32 rows (4 channels per 16-byte unit): 12 channels at 8 of rows of 24 into
// channels 16.. of rows of 40; the destination's other channels stay untouched
void test_copy_rows() {
  const unsigned n = 2, h = 3, w = 5, cs = 24, c0 = 8, c = 12, wd = 40, off = 16;
  const unsigned rows = n * h * w;
  std::vector<float> src(rows * cs), dst(rows * wd, -1.f);
  for (size_t i = 0; i < src.size(); i++) src[i] = (float)i;
  run(3, 7, [&] {
    copy_rows_x16((const uint4 *)(src.data() + c0), (uint4 *)(dst.data() + off), rows, c / 4, cs / 4, wd / 4);
  });
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
  for (unsigned b = 0; b < n; b++)
    for (unsigned y = 0; y < ih * fh; y++)
      for (unsigned x = 0; x < iw * fw; x++)
        for (unsigned k = 0; k < c; k++)
          CHECK(dst[((b * ih * fh + y) * iw * fw + x) * c + k] == src[((b * ih + y / fh) * iw + x / fw) * c + k]);
}
void test_to_nhwc() {
  const unsigned n = 3, c = 3, h = 4, w = 7;
  std::vector<float> src(n * c * h * w), dst(n * c * h * w, -1.f);
  for (size_t i = 0; i < src.size(); i++) src[i] = (float)i;
  run(2, 5, [&] { to_nhwc_f32(src.data(), dst.data(), n * h * w, h * w, c); });
  for (unsigned b = 0; b < n; b++)
    for (unsigned y = 0; y < h; y++)
      for (unsigned x = 0; x < w; x++)
        for (unsigned k = 0; k < c; k++)
          CHECK(dst[((b * h + y) * w + x) * c + k] == src[((b * c + k) * h + y) * w + x]);
}
void test_normalize_cl() {
  std::vector<unsigned char> x(2 * 3 * 5 * 3);
  for (size_t i = 0; i < x.size(); i++) x[i] = (unsigned char)(i * 7);
  std::vector<float> y(x.size(), -1.f);
  run(2, 4, [&] { normalize_cl_f32(x.data(), (unsigned)x.size(), y.data()); });
  for (size_t i = 0; i < x.size(); i++) CHECK(y[i] == (float)x[i] / 255.0f);
}
// decode: two levels written into their anchors of one output, against a direct computation
// (the branches' biases added first); every element of the output is written by one of them
void test_decode() {
  const unsigned n = 2, nc = 3, reg = 4;
  const unsigned hs[2] = {4, 2}, ws[2] = {6, 3};
  const float strides[2] = {8.f, 16.f};
  const unsigned total = 4 * 6 + 2 * 3;
  std::vector<float> proj(reg);
  for (unsigned j = 0; j < reg; j++) proj[j] = (float)j;
  std::vector<float> bb(4 * reg), cb(nc);
  for (unsigned j = 0; j < 4 * reg; j++) bb[j] = 0.25f * (float)j - 1.5f;
  for (unsigned k = 0; k < nc; k++) cb[k] = 0.5f - (float)k;
  std::vector<float> out(n * (4 + nc) * total, NAN);
  unsigned off = 0;
  std::vector<std::vector<float>> bxs, cls;
  for (int l = 0; l < 2; l++) {
    unsigned h = hs[l], w = ws[l];
    std::vector<float> bx(n * h * w * 4 * reg), cl(n * h * w * nc);
    for (size_t i = 0; i < bx.size(); i++) bx[i] = std::sin((float)i + l);
    for (size_t i = 0; i < cl.size(); i++) cl[i] = std::cos((float)i * 0.3f + l);
    run(3, 2, [&] {
      decode_f32(bx.data(), cl.data(), proj.data(), bb.data(), cb.data(), out.data(), n, h, w, nc, reg, strides[l],
                 total, off);
    });
    for (unsigned b = 0; b < n; b++)
      for (unsigned a = 0; a < h * w; a++) {
        const float *p = &bx[(b * h * w + a) * 4 * reg];
        float d[4];
        for (int s = 0; s < 4; s++) {
          float m = -1e30f;
          for (unsigned j = 0; j < reg; j++) m = std::fmax(m, p[s * reg + j] + bb[s * reg + j]);
          float sum = 0, acc = 0;
          for (unsigned j = 0; j < reg; j++) {
            float e = std::exp(p[s * reg + j] + bb[s * reg + j] - m);
            sum += e;
            acc += e * proj[j];
          }
          d[s] = acc / sum;
        }
        float ax = (a % w) + 0.5f, ay = (a / w) + 0.5f;
        float x1 = ax - d[0], y1 = ay - d[1], x2 = ax + d[2], y2 = ay + d[3];
        float want[4] = {(x1 + x2) * 0.5f * strides[l], (y1 + y2) * 0.5f * strides[l], (x2 - x1) * strides[l],
                         (y2 - y1) * strides[l]};
        for (int r = 0; r < 4; r++) CHECK(std::fabs(out[(b * (4 + nc) + r) * total + off + a] - want[r]) < 1e-5f);
        for (unsigned k = 0; k < nc; k++)
          CHECK(std::fabs(out[(b * (4 + nc) + 4 + k) * total + off + a] -
                          1.f / (1.f + std::exp(-(cl[(b * h * w + a) * nc + k] + cb[k])))) < 1e-6f);
      }
    off += h * w;
  }
  for (float v : out) CHECK(!std::isnan(v));
}
// a fixed pseudo-random sequence in [-4, 4)
static float rnd() {
  static uint32_t state = 12345;
  state = state * 1664525u + 1013904223u;
  return ((state >> 8) / 16777216.0f) * 8.0f - 4.0f;
}
static std::vector<__half> halves(size_t n) {
  std::vector<__half> v(n);
  for (auto &h : v) h = __float2half_rn(rnd());
  return v;
}
static float silu_ref(float v) { return v / (1.0f + std::exp(-v)); }
static bool same(__half a, __half b) { return a.bits == b.bits; }

// every finite half converts to the same float as IEEE binary16 and back to itself
void test_half_conversions() {
  for (uint32_t b = 0; b < 0x10000; b++) {
    const __half h{(uint16_t)b};
    const float f = __half2float(h);
    if (std::isnan(f)) continue;
    CHECK(__float2half_rn(f).bits == b);
  }
  CHECK(__half2float(__half{0x3c00}) == 1.0f && __half2float(__half{0xc000}) == -2.0f);
  CHECK(__half2float(__half{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(__float2half_rn(65520.0f).bits == 0x7c00);                     // rounds up to infinity
  CHECK(__float2half_rn(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00); // a tie to even
}

// the f16 instantiations of the head's decode, the channels-last input and the relayout
void test_f16_paths() {
  {
    const unsigned n = 2, h = 3, w = 4, nc = 5, reg = 4, total = 3 * 4 + 5, off = 5;
    std::vector<__half> bx = halves(n * h * w * 4 * reg), cl = halves(n * h * w * nc),
                        out(n * (4 + nc) * total, __half{0x7e00});
    std::vector<float> proj(reg), bb(4 * reg), cb(nc);
    for (unsigned j = 0; j < reg; j++) proj[j] = (float)j;
    for (unsigned j = 0; j < 4 * reg; j++) bb[j] = rnd() * 0.5f;
    for (unsigned k = 0; k < nc; k++) cb[k] = rnd() * 0.5f;
    run(2, 5, [&] {
      decode_f16(bx.data(), cl.data(), proj.data(), bb.data(), cb.data(), out.data(), n, h, w, nc, reg, 8.0f, total,
                 off);
    });
    for (unsigned b = 0; b < n; b++)
      for (unsigned a = 0; a < h * w; a++) {
        float d[4];
        for (int s4 = 0; s4 < 4; s4++) {
          const __half *p = &bx[((b * h * w + a) * 4 + s4) * reg];
          float m = -INFINITY, sum = 0, acc = 0;
          const float *q = &bb[s4 * reg];
          for (unsigned j = 0; j < reg; j++) m = std::fmax(m, __half2float(p[j]) + q[j]);
          for (unsigned j = 0; j < reg; j++) {
            const float e = std::exp(__half2float(p[j]) + q[j] - m);
            sum += e;
            acc += e * proj[j];
          }
          d[s4] = acc / sum;
        }
        const float ax = (a % w) + 0.5f, ay = (a / w) + 0.5f;
        const float x1 = ax - d[0], y1 = ay - d[1], x2 = ax + d[2], y2 = ay + d[3];
        const float want[4] = {(x1 + x2) * 0.5f * 8.0f, (y1 + y2) * 0.5f * 8.0f, (x2 - x1) * 8.0f, (y2 - y1) * 8.0f};
        for (int r = 0; r < 4; r++) CHECK(same(out[(b * (4 + nc) + r) * total + off + a], __float2half_rn(want[r])));
        for (unsigned k = 0; k < nc; k++) {
          const float z = __half2float(cl[(b * h * w + a) * nc + k]) + cb[k];
          CHECK(same(out[(b * (4 + nc) + 4 + k) * total + off + a], __float2half_rn(1.0f / (1.0f + std::exp(-z)))));
        }
      }
    // the anchors of other levels are left alone
    for (unsigned b = 0; b < n; b++)
      for (unsigned r = 0; r < 4 + nc; r++)
        for (unsigned a = 0; a < off; a++) CHECK(out[(b * (4 + nc) + r) * total + a].bits == 0x7e00);
  }
  {
    std::vector<unsigned char> x(2 * 3 * 5 * 3);
    for (size_t i = 0; i < x.size(); i++) x[i] = (unsigned char)(i * 37);
    std::vector<__half> y(x.size());
    run(3, 4, [&] { normalize_cl_f16(x.data(), (unsigned)x.size(), y.data()); });
    for (size_t i = 0; i < x.size(); i++) CHECK(same(y[i], __float2half_rn((float)x[i] / 255.0f)));
  }
  {
    const unsigned n = 2, c = 3, h = 5, w = 3;
    std::vector<__half> x = halves(n * c * h * w), y(x.size());
    run(4, 3, [&] { to_nhwc_f16(x.data(), y.data(), n * h * w, h * w, c); });
    for (unsigned b = 0; b < n; b++)
      for (unsigned p = 0; p < h * w; p++)
        for (unsigned k = 0; k < c; k++) CHECK(same(y[(b * h * w + p) * c + k], x[(b * c + k) * h * w + p]));
  }
}

// the convolution epilogue: act(y + bias[c]) (+ residual), channels last in 16-byte units (also
// into a channel slice of a wider buffer) and in pairs, and NCHW in f32
void test_epilogue() {
  const unsigned pixels = 7, c = 16, n = pixels * c;
  std::vector<__half> y = halves(n), bias = halves(c), res = halves(n);
  auto want = [&](size_t i, unsigned ch, int act, int has_res) {
    float v = __half2float(y[i]) + __half2float(bias[ch]);
    if (act) v = silu_ref(v);
    if (has_res) v += __half2float(res[i]);
    return __float2half_rn(v);
  };
  for (int act = 0; act < 2; act++)
    for (int has_res = 0; has_res < 2; has_res++) {
      std::vector<__half> out(n);
      run(2, 3, [&] {
        bias_act_cl_f16x8((const uint4 *)y.data(), (const uint4 *)bias.data(), (const uint4 *)res.data(),
                          (uint4 *)out.data(), n / 8, c / 8, act, has_res);
      });
      for (size_t i = 0; i < n; i++) CHECK(same(out[i], want(i, i % c, act, has_res)));
      std::vector<__half> pairs(n);
      run(3, 2, [&] {
        bias_act_cl_f16x2((const __half2 *)y.data(), (const __half2 *)bias.data(), (const __half2 *)res.data(),
                          (__half2 *)pairs.data(), n / 2, c / 2, act, has_res);
      });
      for (size_t i = 0; i < n; i++) CHECK(same(pairs[i], want(i, i % c, act, has_res)));
    }
  {
    // channels 8..24 of rows of 40
    const unsigned width = 40, off = 8;
    std::vector<__half> buf(pixels * width, __half{0x7e00});
    run(2, 5, [&] {
      bias_act_cl_f16x8_into((const uint4 *)y.data(), (const uint4 *)bias.data(), (uint4 *)buf.data(), n / 8, c / 8,
                             width / 8, off / 8, 1);
    });
    for (unsigned p = 0; p < pixels; p++)
      for (unsigned k = 0; k < width; k++) {
        if (k >= off && k < off + c)
          CHECK(same(buf[p * width + k], want(p * c + (k - off), k - off, 1, 0)));
        else
          CHECK(buf[p * width + k].bits == 0x7e00);
      }
  }
  {
    // NCHW: 2 pictures, 3 channels of 4x5
    const unsigned nb = 2, ch = 3, hw = 20, total = nb * ch * hw;
    std::vector<float> yf(total), bf(ch), rf(total), of(total);
    for (auto &v : yf) v = rnd();
    for (auto &v : bf) v = rnd();
    for (auto &v : rf) v = rnd();
    run(3, 3, [&] { bias_act_f32(yf.data(), bf.data(), rf.data(), of.data(), total, hw, ch, 1, 1); });
    for (unsigned i = 0; i < total; i++) CHECK(of[i] == silu_ref(yf[i] + bf[(i / hw) % ch]) + rf[i]);
    std::vector<__half> yh = halves(total), bh = halves(ch), oh(total);
    run(2, 4, [&] {
      bias_act_f16x2((const __half2 *)yh.data(), bh.data(), nullptr, (__half2 *)oh.data(), total / 2, hw / 2, ch, 1, 0);
    });
    for (unsigned i = 0; i < total; i++)
      CHECK(same(oh[i], __float2half_rn(silu_ref(__half2float(yh[i]) + __half2float(bh[(i / hw) % ch])))));
  }
}

// channels-last pooling of a channel slice: SPPELAN's 5x5 max, ADown's 3x3/2 max and 2x2 average
void test_pool() {
  const unsigned n = 2, h = 5, w = 6, c = 16, cs = 32, c0 = 8;
  std::vector<__half> xh = halves(n * h * w * cs);
  std::vector<float> xf(xh.size());
  for (size_t i = 0; i < xh.size(); i++) xf[i] = __half2float(xh[i]);
  struct Case {
    unsigned k, s, p;
    int is_max;
  };
  for (Case cs_ : {Case{5, 1, 2, 1}, Case{3, 2, 1, 1}, Case{2, 1, 0, 0}}) {
    const unsigned oh = (h + 2 * cs_.p - cs_.k) / cs_.s + 1, ow = (w + 2 * cs_.p - cs_.k) / cs_.s + 1,
                   n_out = n * oh * ow * c;
    std::vector<__half> y8(n_out), y1(n_out);
    std::vector<float> yf(n_out);
    run(2, 7, [&] {
      pool_nhwc_f16x8(xh.data() + c0, y8.data(), n_out / 8, h, w, c, cs, oh, ow, cs_.k, cs_.s, cs_.p, cs_.is_max);
    });
    run(3, 5,
        [&] { pool_nhwc_f16(xh.data() + c0, y1.data(), n_out, h, w, c, cs, oh, ow, cs_.k, cs_.s, cs_.p, cs_.is_max); });
    run(3, 5,
        [&] { pool_nhwc_f32(xf.data() + c0, yf.data(), n_out, h, w, c, cs, oh, ow, cs_.k, cs_.s, cs_.p, cs_.is_max); });
    for (unsigned b = 0; b < n; b++)
      for (unsigned oy = 0; oy < oh; oy++)
        for (unsigned ox = 0; ox < ow; ox++)
          for (unsigned k = 0; k < c; k++) {
            float acc = cs_.is_max ? -INFINITY : 0.0f;
            for (unsigned dy = 0; dy < cs_.k; dy++)
              for (unsigned dx = 0; dx < cs_.k; dx++) {
                const int yy = (int)(oy * cs_.s + dy) - (int)cs_.p, xx = (int)(ox * cs_.s + dx) - (int)cs_.p;
                if (yy < 0 || yy >= (int)h || xx < 0 || xx >= (int)w) continue;
                const float v = xf[((b * h + yy) * w + xx) * cs + c0 + k];
                acc = cs_.is_max ? std::fmax(acc, v) : acc + v;
              }
            const float v = cs_.is_max ? acc : acc / (float)(cs_.k * cs_.k);
            const size_t o = ((b * oh + oy) * ow + ox) * c + k;
            CHECK(same(y8[o], __float2half_rn(v)) && same(y1[o], __float2half_rn(v)) && yf[o] == v);
          }
  }
}

// CBFuse: base + the nearest upsampling of two strided sources at factors 2 and 4
void test_fuse() {
  const unsigned n = 2, h = 8, w = 4, c = 3;
  std::vector<float> base(n * h * w * c), out(base.size());
  for (auto &v : base) v = rnd();
  // sources: channel slices (channels 1..4 of 5) of (n, h/f, w/f, 5)
  auto source = [&](unsigned f) {
    std::vector<float> s(n * (h / f) * (w / f) * 5);
    for (auto &v : s) v = rnd();
    return s;
  };
  std::vector<float> s0 = source(2), s1 = source(4);
  auto desc = [&](unsigned f) {
    return Src{(unsigned long long)(h / f) * (w / f) * 5, (unsigned long long)(w / f) * 5, 5ull, 1ull, f};
  };
  const Src d0 = desc(2), d1 = desc(4);
  run(3, 4, [&] { fuse_f32(base.data(), out.data(), s0.data() + 1, d0, s1.data() + 1, d1, 1, base.size(), h, w, c); });
  for (unsigned b = 0; b < n; b++)
    for (unsigned y = 0; y < h; y++)
      for (unsigned x = 0; x < w; x++)
        for (unsigned k = 0; k < c; k++) {
          const size_t i = ((b * h + y) * w + x) * c + k;
          const float a = s0[((b * (h / 2) + y / 2) * (w / 2) + x / 2) * 5 + 1 + k];
          const float e = s1[((b * (h / 4) + y / 4) * (w / 4) + x / 4) * 5 + 1 + k];
          CHECK(out[i] == base[i] + a + e);
        }
}

// score filtering: every anchor whose best class scores above `conf`, with its box, class (the
// first of tied classes), picture and anchor, appended to one list after a header row whose
// first word counts them
void test_candidates() {
  const unsigned b = 3, nc = 5, no = 4 + nc, a = 37;
  std::vector<__half> raw(b * no * a);
  for (auto &h : raw) h = __float2half_rn(rnd() / 8.0f + 0.5f);
  // a tie between classes 1 and 3 of picture 1, anchor 2: class 1 is kept
  for (unsigned c = 0; c < nc; c++) raw[(1 * no + 4 + c) * a + 2] = __float2half_rn(c == 1 || c == 3 ? 0.9f : 0.1f);
  const float conf = 0.8f;
  std::vector<float> out((1 + b * a) * 8, NAN);
  std::fill(out.begin(), out.begin() + 8, 0.0f); // the header, zeroed as the host does
  run(4, 5, [&] { select_f16(raw.data(), b, no, a, conf, out.data()); });
  unsigned int count;
  std::memcpy(&count, out.data(), sizeof count);
  std::vector<std::vector<float>> want;
  for (unsigned n = 0; n < b; n++)
    for (unsigned j = 0; j < a; j++) {
      float best = -INFINITY;
      unsigned cls = 0;
      for (unsigned c = 0; c < nc; c++) {
        const float s = __half2float(raw[(n * no + 4 + c) * a + j]);
        if (s > best) {
          best = s;
          cls = c;
        }
      }
      if (best > conf) {
        std::vector<float> row;
        for (unsigned r = 0; r < 4; r++) row.push_back(__half2float(raw[(n * no + r) * a + j]));
        row.insert(row.end(), {best, (float)cls, (float)n, (float)j});
        want.push_back(row);
      }
    }
  CHECK(count == want.size() && count > 3);
  // the list's order is the threads' (atomic appends): compare as sets ordered by (n, j)
  std::vector<std::vector<float>> got;
  for (unsigned k = 0; k < count; k++) got.emplace_back(out.begin() + (k + 1) * 8, out.begin() + (k + 2) * 8);
  auto key = [](const std::vector<float> &r) { return r[6] * 1e6f + r[7]; };
  std::sort(got.begin(), got.end(), [&](auto &x, auto &y) { return key(x) < key(y); });
  CHECK(got == want);
  const auto tie = std::find_if(got.begin(), got.end(), [](auto &r) { return r[6] == 1.0f && r[7] == 2.0f; });
  CHECK(tie != got.end() && (*tie)[5] == 1.0f);
}

int main() {
  test_copy_rows();
  test_upsample();
  test_to_nhwc();
  test_normalize_cl();
  test_decode();
  test_half_conversions();
  test_f16_paths();
  test_epilogue();
  test_pool();
  test_fuse();
  test_candidates();
  printf("%s (%d failures)\n", fails ? "FAILED" : "ok", fails);
  return fails != 0;
}
