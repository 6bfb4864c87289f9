// The device NMS (`nms.cu`) on the host: its three launches on one raw output, each block's
// threads as host threads meeting at its barriers (`run_threads`), so that the chunked pass, the
// shared kept list and the counting sort run as they do on the device. Reads a case from the
// file named first (u32 pictures, rows, anchors, max_det, max_nms, f16 flag; f32 conf, iou; then
// the raw output as f32, already f16 values where the flag is set) and writes the kept rows to
// the file named second (u32 count, then 8 f32 a row). The `device_nms_is_the_host_nms` test
// (tests/model/kernels.rs) makes the cases and compares the rows with `postprocess::nms`.
// Prints "ok" and exits 0 when the launches ran.
#include <cstdio>
#include <vector>

#include "cuda_fp16.h"
#include "nms.cu"

int main(int argc, char **argv) {
  if (argc != 3) {
    printf("usage: nms_check CASE KEPT\n");
    return 2;
  }
  FILE *in = fopen(argv[1], "rb");
  unsigned int head[6];
  float th[2];
  if (!in || fread(head, 4, 6, in) != 6 || fread(th, 4, 2, in) != 2) {
    printf("cannot read %s\n", argv[1]);
    return 2;
  }
  const unsigned int b = head[0], no = head[1], a = head[2], max_det = head[3], max_nms = head[4], f16 = head[5];
  std::vector<float> raw((size_t)b * no * a);
  if (fread(raw.data(), 4, raw.size(), in) != raw.size()) {
    printf("%s is short\n", argv[1]);
    return 2;
  }
  fclose(in);
  // what the host allocates: rows and order uninitialised (NaN and a stray index stand in for
  // whatever the device memory held), counts and ranks zeroed, the output's header zeroed
  std::vector<float> rows((size_t)b * a * ROW, NAN);
  std::vector<unsigned int> work(b + (size_t)b * a, 0), order((size_t)b * a, 0xdeadbeef);
  const unsigned int per_picture = std::min(std::min(max_det, a), (unsigned int)MAX_KEPT);
  std::vector<float> out((1 + (size_t)b * per_picture) * ROW, NAN);
  std::fill(out.begin(), out.begin() + ROW, 0.0f);
  unsigned int *counts = work.data(), *ranks = work.data() + b;
  if (f16) {
    std::vector<__half> h(raw.size());
    for (size_t i = 0; i < raw.size(); i++) h[i] = __float2half_rn(raw[i]);
    run(3, 64, [&] { group_f16(h.data(), b, no, a, th[0], rows.data(), counts); });
  } else {
    run(3, 64, [&] { group_f32(raw.data(), b, no, a, th[0], rows.data(), counts); });
  }
  // fewer blocks than work items: each block loops over several
  run_threads(5, RANK_TILE, [&] { rank(rows.data(), counts, b, a, ranks); });
  run_threads(b, SUPPRESS_THREADS,
              [&] { suppress(rows.data(), counts, ranks, a, max_nms, th[1], max_det, order.data(), out.data()); });
  unsigned int count;
  std::memcpy(&count, out.data(), 4);
  if (count > (size_t)b * per_picture) {
    printf("FAILED: %u kept rows, room for %zu\n", count, (size_t)b * per_picture);
    return 1;
  }
  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(&count, 4, 1, o) != 1 ||
      fwrite(out.data() + ROW, 4, (size_t)count * ROW, o) != (size_t)count * ROW) {
    printf("cannot write %s\n", argv[2]);
    return 2;
  }
  fclose(o);
  printf("ok (%u kept)\n", count);
  return 0;
}
