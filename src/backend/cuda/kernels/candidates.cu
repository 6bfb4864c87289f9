// Score filtering on the device. For every anchor j of picture n in the raw output
// (B, 4 + nc, A): the best class and its score; an anchor whose best score is above `conf` is
// appended to one list shared by the batch as 8 floats (x, y, w, h, score, class, n, j). `out`
// starts with one 8-float header whose first word counts the rows (an unsigned integer, zeroed
// before the launch); the rows follow it, so that the count and the first rows come back to the
// host in one copy, which orders them by (n, j). Ties between classes keep the first (as torch's
// max). Contiguous input.
// Built to PTX by build.rs (feature `cuda`); launched from src/backend/cuda/candidates.rs.
#include "scores.cuh"

template <typename T>
__device__ void select(const T *raw, unsigned int b, unsigned int no, unsigned int a, float conf, float *out) {
  const unsigned int total = b * a;
  unsigned int *count = reinterpret_cast<unsigned int *>(out);
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned int n = i / a, j = i % a;
    const T *p = raw + (size_t)n * no * a + j;
    unsigned int cls;
    const float best = best_class(p, no, a, &cls);
    if (best > conf) {
      const unsigned int k = atomicAdd(count, 1u);
      candidate_row(out + 8 + (size_t)k * 8, p, a, best, cls, n, j);
    }
  }
}

extern "C" __global__ void select_f32(const float *raw, unsigned int b, unsigned int no, unsigned int a, float conf,
                                      float *out) {
  select<float>(raw, b, no, a, conf, out);
}

extern "C" __global__ void select_f16(const __half *raw, unsigned int b, unsigned int no, unsigned int a, float conf,
                                      float *out) {
  select<__half>(raw, b, no, a, conf, out);
}
