// The device letterbox (`letterbox.cu`) on the host against libjpeg-turbo, the decoder behind the
// reference's `cv2.imread`: JPEGs are decoded twice by libjpeg-turbo, once into its raw planes
// (the Y, Cb and Cr samples after the IDCT, before upsampling: what nvJPEG returns when asked for
// planar YUV) and once into RGB with its defaults (fancy upsampling, YCbCr to RGB in fixed point);
// the kernel reading the planes must give libjpeg-turbo's RGB byte for byte, as a copy and through
// a resize (against the kernel reading libjpeg-turbo's RGB with the same taps). Pictures: made
// here at 4:4:4, 4:2:2 and 4:2:0, even and odd sides down to 3 pixels, and the JPEG files named on
// the command line. Built and run by the `letterbox_planes_are_libjpeg_turbo` test
// (tests/model/kernels.rs, with `-ljpeg`); prints "ok" and exits 0 when every check holds.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_fp16.h"
#include "letterbox.cu"
#include <jpeglib.h>

static int fails = 0;

struct Fail {
  jpeg_error_mgr pub;
  jmp_buf jump;
};
static void on_error(j_common_ptr c) { longjmp(((Fail *)c->err)->jump, 1); }

// A picture as libjpeg-turbo decodes it: RGB, and the planes before upsampling in one buffer.
struct Decoded {
  unsigned int w = 0, h = 0;
  std::vector<unsigned char> rgb;
  std::vector<unsigned char> planes; // Y, then Cb, then Cr, each `pitch[c]` x `rows[c]`
  size_t offset[3] = {0, 0, 0}, pitch[3] = {0, 0, 0}, rows[3] = {0, 0, 0};
  int hs = 1, vs = 1; // chroma halved across, down (1 or 2)
};

static bool decode(const std::vector<unsigned char> &jpeg, Decoded &d) {
  jpeg_decompress_struct c;
  Fail f;
  c.err = jpeg_std_error(&f.pub);
  f.pub.error_exit = on_error;
  if (setjmp(f.jump)) {
    jpeg_destroy_decompress(&c);
    return false;
  }
  jpeg_create_decompress(&c);
  // RGB with the library's defaults
  jpeg_mem_src(&c, jpeg.data(), jpeg.size());
  jpeg_read_header(&c, TRUE);
  if (c.num_components != 3 || c.jpeg_color_space != JCS_YCbCr) {
    jpeg_destroy_decompress(&c);
    return false;
  }
  c.out_color_space = JCS_RGB;
  jpeg_start_decompress(&c);
  d.w = c.output_width;
  d.h = c.output_height;
  d.rgb.resize((size_t)d.w * d.h * 3);
  while (c.output_scanline < c.output_height) {
    JSAMPROW row = d.rgb.data() + (size_t)c.output_scanline * d.w * 3;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  // the raw planes
  jpeg_mem_src(&c, jpeg.data(), jpeg.size());
  jpeg_read_header(&c, TRUE);
  c.raw_data_out = TRUE;
  jpeg_start_decompress(&c);
  const int mv = c.max_v_samp_factor;
  const size_t imcu_rows = (c.output_height + mv * DCTSIZE - 1) / (mv * DCTSIZE);
  size_t total = 0;
  for (int k = 0; k < 3; k++) {
    const jpeg_component_info &ci = c.comp_info[k];
    d.pitch[k] = (size_t)ci.width_in_blocks * DCTSIZE;
    d.rows[k] = imcu_rows * ci.v_samp_factor * DCTSIZE;
    d.offset[k] = total;
    total += d.pitch[k] * d.rows[k];
  }
  d.hs = c.comp_info[0].h_samp_factor / c.comp_info[1].h_samp_factor;
  d.vs = c.comp_info[0].v_samp_factor / c.comp_info[1].v_samp_factor;
  d.planes.assign(total, 0);
  std::vector<JSAMPROW> rows[3];
  for (size_t m = 0; m < imcu_rows; m++) {
    JSAMPARRAY arrays[3];
    for (int k = 0; k < 3; k++) {
      const size_t n = c.comp_info[k].v_samp_factor * DCTSIZE;
      rows[k].resize(n);
      for (size_t r = 0; r < n; r++) rows[k][r] = d.planes.data() + d.offset[k] + (m * n + r) * d.pitch[k];
      arrays[k] = rows[k].data();
    }
    jpeg_read_raw_data(&c, arrays, mv * DCTSIZE);
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  return true;
}

static std::vector<unsigned char> encode(unsigned int w, unsigned int h, int hs, int vs) {
  std::vector<unsigned char> rgb((size_t)w * h * 3);
  for (unsigned int y = 0; y < h; y++)
    for (unsigned int x = 0; x < w; x++) {
      unsigned long long v = (x * 0x9E3779B97F4A7C15ull) ^ (y * 0xC2B2AE3D27D4EB4Full);
      v ^= v >> 29;
      v *= 0xBF58476D1CE4E5B9ull;
      // noise over gradients and a hard edge: every chroma value, no flat areas
      unsigned char *p = &rgb[((size_t)y * w + x) * 3];
      p[0] = (unsigned char)((x * 255 / w + (v & 63)) & 255);
      p[1] = (unsigned char)(x * 3 > w * 2 ? 250 - ((v >> 8) & 31) : (y * 255 / h));
      p[2] = (unsigned char)((v >> 16) & 255);
    }
  jpeg_compress_struct c;
  jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  unsigned char *out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  c.comp_info[0].h_samp_factor = hs;
  c.comp_info[0].v_samp_factor = vs;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = &rgb[(size_t)c.next_scanline * w * 3];
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<unsigned char> jpeg(out, out + size);
  jpeg_destroy_compress(&c);
  free(out);
  return jpeg;
}

// One launch of the kernel over one slot of `s` into a `w` x `h` input.
static std::vector<unsigned char> letterbox(const std::vector<unsigned char> &base, const Slot &s, unsigned int w,
                                            unsigned int h) {
  std::vector<unsigned char> out((size_t)w * h * 3, 0);
  run(7, 33, [&] { letterbox_u8(base.data(), &s, 0, 1, w, h, out.data()); });
  return out;
}

static void check(const std::string &name, const std::vector<unsigned char> &jpeg) {
  Decoded d;
  if (!decode(jpeg, d)) {
    printf("FAIL %s: libjpeg-turbo did not decode it as YCbCr\n", name.c_str());
    fails++;
    return;
  }
  Slot planar{};
  planar.src = d.offset[0];
  planar.pitch = d.pitch[0];
  planar.sw = d.w;
  planar.sh = d.h;
  planar.nw = d.w;
  planar.nh = d.h;
  planar.mode = 1;
  planar.cb = d.offset[1];
  planar.cr = d.offset[2];
  planar.cpitch = d.pitch[1];
  planar.halved = (d.hs == 2 ? 1 : 0) | (d.vs == 2 ? 2 : 0);
  // a copy: the planes as RGB, byte for byte
  const std::vector<unsigned char> got = letterbox(d.planes, planar, d.w, d.h);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != d.rgb[i] && bad++ == 0) first = i;
  if (bad) {
    const size_t px = first / 3;
    printf("FAIL %s %ux%u (%dx%d chroma): %zu of %zu bytes differ from libjpeg-turbo's RGB, first at (%zu, %zu) "
           "channel %zu: %d, want %d\n",
           name.c_str(), d.w, d.h, d.hs, d.vs, bad, got.size(), px % d.w, px / d.w, first % 3, got[first],
           d.rgb[first]);
    fails++;
    return;
  }
  // a resize to about 2/3, letterboxed into a larger input: the planes against libjpeg-turbo's RGB
  const unsigned int nw = d.w * 2 / 3 + 1, nh = d.h * 2 / 3 + 1, in_w = nw + 3, in_h = nh + 2;
  std::vector<int> taps;
  for (unsigned int k = 0; k < nw + nh; k++) {
    const bool col = k < nw;
    const unsigned int n = col ? nw : nh, src = col ? d.w : d.h, i = col ? k : k - nw;
    const unsigned int s0 = i * src / n, s1 = s0 + 1 < src ? s0 + 1 : s0;
    const int w1 = (int)((i * 2048u * src / n) % 2048u);
    taps.insert(taps.end(), {(int)s0, (int)s1, 2048 - w1, w1});
  }
  planar.taps = (unsigned long long)taps.data();
  planar.nw = nw;
  planar.nh = nh;
  planar.left = 1;
  planar.top = 2;
  planar.mode = 2;
  Slot interleaved = planar;
  interleaved.src = 0;
  interleaved.pitch = (size_t)d.w * 3;
  interleaved.cpitch = 0;
  if (letterbox(d.planes, planar, in_w, in_h) != letterbox(d.rgb, interleaved, in_w, in_h)) {
    printf("FAIL %s %ux%u (%dx%d chroma): the resize of the planes differs from that of the RGB\n", name.c_str(), d.w,
           d.h, d.hs, d.vs);
    fails++;
  }
}

static std::vector<unsigned char> read_file(const char *path) {
  std::vector<unsigned char> b;
  if (FILE *f = fopen(path, "rb")) {
    unsigned char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) b.insert(b.end(), chunk, chunk + n);
    fclose(f);
  }
  return b;
}

int main(int argc, char **argv) {
  const unsigned int sizes[][2] = {{333, 201}, {64, 48}, {17, 9}, {100, 37}, {3, 5}, {4, 3}, {1, 7}};
  const int samplings[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
  for (const auto &sz : sizes)
    for (const auto &sm : samplings)
      check("synthetic " + std::to_string(sm[0]) + "x" + std::to_string(sm[1]), encode(sz[0], sz[1], sm[0], sm[1]));
  for (int k = 1; k < argc; k++) {
    const std::vector<unsigned char> b = read_file(argv[k]);
    if (b.empty()) {
      printf("FAIL %s: not read\n", argv[k]);
      fails++;
      continue;
    }
    check(argv[k], b);
  }
  if (fails) return 1;
  printf("ok\n");
  return 0;
}
