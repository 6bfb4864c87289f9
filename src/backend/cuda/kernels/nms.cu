// Class-aware NMS on the device: the detection step of src/vision/postprocess.rs (`nms`) for
// every picture of a raw output (B, 4 + nc, A), with its order, its f32 arithmetic and so its
// answers. Three launches (src/backend/cuda/nms.rs):
//
// - group_f16 / group_f32: an anchor whose best class score is above `conf` and finite becomes a
//   row (x, y, w, h, score, class, picture, anchor) of its picture's segment of `rows` (A rows a
//   picture, `counts[n]` of them used, in the order the threads appended them).
// - rank: each row's place in its picture's order (score descending, ties by anchor: the host's
//   keys), by counting the rows ahead of it; a block takes 128 rows against a slice of 1024.
// - suppress: a block a picture puts its first `max_nms` rows in that order, then runs the greedy
//   pass a chunk of 256 candidates at a time: each candidate against the boxes kept before the
//   chunk, then those that none overlaps against each other (threads in parallel), then one
//   thread decides the chunk in order, until `max_det` are kept. The kept rows are appended to
//   `out` after its 8-float header (whose first word counts them, an unsigned integer zeroed
//   before the launches), each picture's together and best first, as (x, y, w, h, score, class,
//   picture, place among the picture's kept).
//
// Every floating-point operation of the boxes is an explicitly rounded intrinsic, so that nothing
// is contracted into a multiply-add: the IoUs are the host's bit for bit.
#include "scores.cuh"

#define ROW 8
// Candidates decided per round of `suppress`, and its threads (CHUNK_PARTS threads a candidate).
#define CHUNK 256
#define CHUNK_WORDS (CHUNK / 32)
#define SUPPRESS_THREADS 1024
#define CHUNK_PARTS (SUPPRESS_THREADS / CHUNK)
// Most boxes a picture keeps (`max_det`); nms.rs sends larger `max_det` to the host.
#define MAX_KEPT 1024
// Rows a `rank` block places (its threads), and the slice of rows each is counted against.
#define RANK_TILE 128
#define RANK_SLICE 1024

template <typename T>
__device__ void group(const T *raw, unsigned int b, unsigned int no, unsigned int a, float conf, float *rows,
                      unsigned int *counts) {
  const unsigned int total = b * a;
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const unsigned int n = i / a, j = i % a;
    const T *p = raw + (size_t)n * no * a + j;
    unsigned int cls;
    const float best = best_class(p, no, a, &cls);
    if (best > conf && isfinite(best)) {
      const unsigned int k = atomicAdd(counts + n, 1u);
      candidate_row(rows + ((size_t)n * a + k) * ROW, p, a, best, cls, n, j);
    }
  }
}

extern "C" __global__ void group_f32(const float *raw, unsigned int b, unsigned int no, unsigned int a, float conf,
                                     float *rows, unsigned int *counts) {
  group<float>(raw, b, no, a, conf, rows, counts);
}

extern "C" __global__ void group_f16(const __half *raw, unsigned int b, unsigned int no, unsigned int a, float conf,
                                     float *rows, unsigned int *counts) {
  group<__half>(raw, b, no, a, conf, rows, counts);
}

// A row's key: ascending keys are descending scores (f32's total order), ties by anchor.
__device__ __forceinline__ unsigned long long order_key(const float *r) {
  const unsigned int bits = __float_as_uint(r[4]);
  const unsigned int total = (bits >> 31) ? ~bits : (bits | 0x80000000u);
  return ((unsigned long long)(~total) << 32) | (unsigned int)r[7];
}

// `ranks` (B x A, zeroed) gets, for row i of picture n, the number of its rows with smaller keys.
// Launched with RANK_TILE threads a block and any number of blocks, which loop over the work.
extern "C" __global__ void __launch_bounds__(RANK_TILE)
    rank(const float *rows, const unsigned int *counts, unsigned int b, unsigned int a, unsigned int *ranks) {
  __shared__ unsigned long long slice[RANK_SLICE];
  const unsigned int tiles = (a + RANK_TILE - 1) / RANK_TILE, slices = (a + RANK_SLICE - 1) / RANK_SLICE;
  const unsigned long long per_picture = (unsigned long long)tiles * slices;
  const unsigned long long items = per_picture * b;
  for (unsigned long long item = blockIdx.x; item < items; item += gridDim.x) {
    const unsigned int n = (unsigned int)(item / per_picture);
    const unsigned int tile = (unsigned int)(item % per_picture / slices), s = (unsigned int)(item % slices);
    const unsigned int count = counts[n], i0 = tile * RANK_TILE, j0 = s * RANK_SLICE;
    // the same for every thread of the block
    if (i0 >= count || j0 >= count) {
      continue;
    }
    const float *seg = rows + (size_t)n * a * ROW;
    const unsigned int m = min((unsigned int)RANK_SLICE, count - j0);
    for (unsigned int t = threadIdx.x; t < m; t += blockDim.x) {
      slice[t] = order_key(seg + (size_t)(j0 + t) * ROW);
    }
    __syncthreads();
    const unsigned int i = i0 + threadIdx.x;
    if (i < count) {
      const unsigned long long mine = order_key(seg + (size_t)i * ROW);
      unsigned int ahead = 0;
      for (unsigned int t = 0; t < m; ++t) {
        ahead += slice[t] < mine;
      }
      if (ahead) {
        atomicAdd(ranks + (size_t)n * a + i, ahead);
      }
    }
    __syncthreads();
  }
}

// `if k < s { k } else { s }` and its max, as the host's overlap test writes them (a NaN side of
// the first operand gives the second).
__device__ __forceinline__ float mn(float k, float s) { return k < s ? k : s; }
__device__ __forceinline__ float mx(float k, float s) { return k > s ? k : s; }

// Whether kept box k overlaps candidate c by more than `iou`: the host's
// `inter / (area_k + area_c - inter + 1e-9) > iou`, in its order of operations.
__device__ __forceinline__ bool overlaps(float kx1, float ky1, float kx2, float ky2, float ka, float cx1, float cy1,
                                         float cx2, float cy2, float ca, float iou) {
  const float iw = mx(__fsub_rn(mn(kx2, cx2), mx(kx1, cx1)), 0.0f);
  const float ih = mx(__fsub_rn(mn(ky2, cy2), mx(ky1, cy1)), 0.0f);
  const float inter = __fmul_rn(iw, ih);
  return __fdiv_rn(inter, __fadd_rn(__fsub_rn(__fadd_rn(ka, ca), inter), 1e-9f)) > iou;
}

// One block of SUPPRESS_THREADS a picture; `order` (B x A) is scratch.
extern "C" __global__ void __launch_bounds__(SUPPRESS_THREADS)
    suppress(const float *rows, const unsigned int *counts, const unsigned int *ranks, unsigned int a,
             unsigned int max_nms, float iou, unsigned int max_det, unsigned int *order, float *out) {
  // the kept boxes: class-offset xyxy, area, class, row
  __shared__ float kx1[MAX_KEPT], ky1[MAX_KEPT], kx2[MAX_KEPT], ky2[MAX_KEPT], ka[MAX_KEPT], kc[MAX_KEPT];
  __shared__ unsigned int krow[MAX_KEPT];
  // the chunk's candidates, the same
  __shared__ float cx1[CHUNK], cy1[CHUNK], cx2[CHUNK], cy2[CHUNK], ca[CHUNK], cc[CHUNK];
  __shared__ unsigned int crow[CHUNK];
  // bit j of row c: earlier candidate j of the chunk overlaps candidate c
  __shared__ unsigned int mask[CHUNK][CHUNK_WORDS];
  // candidates a box kept before the chunk overlaps
  __shared__ unsigned int hit[CHUNK_WORDS];
  __shared__ unsigned int kept, base;

  const unsigned int n = blockIdx.x, tid = threadIdx.x;
  const unsigned int count = counts[n], visit = min(count, max_nms);
  const unsigned int limit = min(max_det, (unsigned int)MAX_KEPT);
  const size_t seg = (size_t)n * a;
  for (unsigned int i = tid; i < count; i += blockDim.x) {
    const unsigned int r = ranks[seg + i];
    if (r < max_nms) {
      order[seg + r] = i;
    }
  }
  if (tid == 0) {
    kept = 0;
  }
  __syncthreads();
  const unsigned int c = tid % CHUNK, part = tid / CHUNK;
  for (unsigned int start = 0; start < visit && kept < limit; start += CHUNK) {
    const unsigned int m = min((unsigned int)CHUNK, visit - start);
    if (part == 0) {
      if (c < m) {
        const unsigned int i = order[seg + start + c];
        const float *r = rows + (seg + i) * ROW;
        const float hw = __fdiv_rn(r[2], 2.0f), hh = __fdiv_rn(r[3], 2.0f);
        const float o = __fmul_rn(r[5], 7680.0f);
        const float x1 = __fadd_rn(__fsub_rn(r[0], hw), o), y1 = __fadd_rn(__fsub_rn(r[1], hh), o);
        const float x2 = __fadd_rn(__fadd_rn(r[0], hw), o), y2 = __fadd_rn(__fadd_rn(r[1], hh), o);
        cx1[c] = x1;
        cy1[c] = y1;
        cx2[c] = x2;
        cy2[c] = y2;
        ca[c] = __fmul_rn(__fsub_rn(x2, x1), __fsub_rn(y2, y1));
        cc[c] = r[5];
        crow[c] = i;
      }
      if (c < CHUNK_WORDS) {
        hit[c] = 0;
      }
    }
    __syncthreads();
    const float x1 = cx1[c], y1 = cy1[c], x2 = cx2[c], y2 = cy2[c], ar = ca[c], cls = cc[c];
    if (c < m) {
      for (unsigned int k = part; k < kept; k += CHUNK_PARTS) {
        if (kc[k] == cls && overlaps(kx1[k], ky1[k], kx2[k], ky2[k], ka[k], x1, y1, x2, y2, ar, iou)) {
          atomicOr(hit + c / 32, 1u << (c % 32));
          break;
        }
      }
    }
    __syncthreads();
    // against the earlier candidates of the chunk, only where no kept box overlaps either: one
    // that a kept box overlaps is out whatever the chunk holds, and suppresses nothing
    if (c < m && !((hit[c / 32] >> (c % 32)) & 1)) {
      for (unsigned int w = part; w < CHUNK_WORDS; w += CHUNK_PARTS) {
        const unsigned int below = c > w * 32 ? c - w * 32 : 0;
        unsigned int open = ~hit[w], bits = 0;
        if (below < 32) {
          open &= (1u << below) - 1;
        }
        while (open) {
          const unsigned int l = __ffs(open) - 1;
          open &= open - 1;
          const unsigned int j = w * 32 + l;
          if (cc[j] == cls && overlaps(cx1[j], cy1[j], cx2[j], cy2[j], ca[j], x1, y1, x2, y2, ar, iou)) {
            bits |= 1u << l;
          }
        }
        mask[c][w] = bits;
      }
    }
    __syncthreads();
    // the chunk in order: a candidate survives unless a box kept before the chunk or one kept
    // earlier in it overlaps it
    if (tid == 0) {
      unsigned int took[CHUNK_WORDS] = {0};
      unsigned int k = kept;
      for (unsigned int w = 0; w * 32 < m && k < limit; ++w) {
        unsigned int open = ~hit[w];
        if (m - w * 32 < 32) {
          open &= (1u << (m - w * 32)) - 1;
        }
        while (open && k < limit) {
          const unsigned int l = __ffs(open) - 1;
          open &= open - 1;
          const unsigned int t = w * 32 + l;
          bool over = false;
          for (unsigned int v = 0; v <= w; ++v) {
            over |= (mask[t][v] & took[v]) != 0;
          }
          if (over) {
            continue;
          }
          took[w] |= 1u << l;
          kx1[k] = cx1[t];
          ky1[k] = cy1[t];
          kx2[k] = cx2[t];
          ky2[k] = cy2[t];
          ka[k] = ca[t];
          kc[k] = cc[t];
          krow[k] = crow[t];
          ++k;
        }
      }
      kept = k;
    }
    __syncthreads();
  }
  if (tid == 0) {
    base = kept ? atomicAdd(reinterpret_cast<unsigned int *>(out), kept) : 0;
  }
  __syncthreads();
  for (unsigned int k = tid; k < kept; k += blockDim.x) {
    const float *r = rows + (seg + krow[k]) * ROW;
    float *o = out + (size_t)(1 + base + k) * ROW;
    for (unsigned int f = 0; f < 6; ++f) {
      o[f] = r[f];
    }
    o[6] = (float)n;
    o[7] = (float)k;
  }
}
