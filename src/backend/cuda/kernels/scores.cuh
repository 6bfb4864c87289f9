// The best class of one anchor and its candidate row, shared by the score filters (candidates.cu,
// nms.cu).
#pragma once
#include "common.cuh"

// The best class score of the anchor at `p` (its first row of a raw output (B, 4 + nc, A), whose
// rows lie `a` apart) and its class; ties keep the first class (as torch's max).
template <typename T>
__device__ __forceinline__ float best_class(const T *p, unsigned int no, unsigned int a, unsigned int *cls) {
  float best = ld(p[4 * (size_t)a]);
  unsigned int arg = 0;
  for (unsigned int c = 1; c + 4 < no; ++c) {
    const float s = ld(p[(4 + (size_t)c) * a]);
    if (s > best) {
      best = s;
      arg = c;
    }
  }
  *cls = arg;
  return best;
}

// The candidate row of the anchor at `p` with its best score and class: x, y, w, h, score, class,
// picture `n`, anchor `j`.
template <typename T>
__device__ __forceinline__ void candidate_row(float *o, const T *p, unsigned int a, float best, unsigned int cls,
                                              unsigned int n, unsigned int j) {
  o[0] = ld(p[0]);
  o[1] = ld(p[(size_t)a]);
  o[2] = ld(p[2 * (size_t)a]);
  o[3] = ld(p[3 * (size_t)a]);
  o[4] = best;
  o[5] = (float)cls;
  o[6] = (float)n;
  o[7] = (float)j;
}
