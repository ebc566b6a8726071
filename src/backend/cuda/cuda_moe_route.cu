// MoE routing: router logits -> expert ids and weights, one warp per token row (MoeRouting's
// numbered steps in backend.h).
//
// Why this shape: a row has at most 256 experts, so one warp holds it (8 experts per lane, the
// row's scores in shared memory); every selection is a warp-wide argmax with shuffles, no block
// barrier, so rows are independent and a block simply holds four of them. The selection must pick
// exactly the experts the CPU twin picks, so:
//  - ties go to the lower index everywhere (the comparator below is a strict total order on
//    (value, index), so the butterfly reduction gives every lane the same winner);
//  - softmax divides every score of a row by the same sum, which keeps the order of the logits;
//    sigmoid is monotonic; expf (not the approximate __expf) keeps them within an ulp or two of
//    the CPU's, so only values closer than that could order differently;
//  - the renormalising sum runs in the same order as the CPU's (lane 0, column order).
#include <climits>

#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per row
constexpr int kPerLane = kMaxRouteExperts / 32;

// NaN ranks as -inf, so that a row of garbage (e.g. an uninitialised padding row) still selects
// valid, distinct experts instead of no expert at all.
__device__ __forceinline__ float rank_value(float v) { return v != v ? -INFINITY : v; }

__global__ void __launch_bounds__(kRowsPerBlock * 32) moe_route_kernel(MoeRouteParams p) {
  __shared__ float scores_all[kRowsPerBlock][kMaxRouteExperts];
  __shared__ float choice_all[kRowsPerBlock][kMaxRouteExperts];
  __shared__ float group_all[kRowsPerBlock][kMaxRouteExperts];
  __shared__ unsigned char kept_all[kRowsPerBlock][kMaxRouteExperts];
  __shared__ int chosen_all[kRowsPerBlock][kMaxRouteExperts];
  allow_next_kernel_start();
  wait_for_previous_kernels();  // the router's logits
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  if (row >= p.tokens) return;  // the whole warp leaves; nothing below waits for other warps
  const int e = p.experts;
  float* scores = scores_all[warp];
  float* choice = choice_all[warp];
  float* group_scores = group_all[warp];
  unsigned char* kept = kept_all[warp];
  int* chosen = chosen_all[warp];
  const float* l = p.logits + row * e;

  // 1. Scores, and the (biased) values the selection ranks. Each lane owns experts lane + 32 j.
  if (p.sigmoid) {
    for (int i = lane; i < e; i += 32) scores[i] = 1.0f / (1.0f + expf(-l[i]));
  } else {
    float m = -INFINITY;
    for (int i = lane; i < e; i += 32) m = fmaxf(m, l[i]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int i = lane; i < e; i += 32) {
      const float x = expf(l[i] - m);
      scores[i] = x;
      sum += x;
    }
    sum = warp_sum(sum);
    for (int i = lane; i < e; i += 32) scores[i] = scores[i] / sum;
  }
  for (int i = lane; i < e; i += 32) choice[i] = p.bias != nullptr ? scores[i] + p.bias[i] : scores[i];
  __syncwarp();  // the group pass reads other lanes' choices

  // 2. Group-limited selection: the topk_groups best groups stay selectable.
  const int group_size = e / p.num_groups;
  if (p.num_groups > 1) {
    for (int g = lane; g < p.num_groups; g += 32) {
      const float* c = choice + g * group_size;
      float first = -INFINITY, second = -INFINITY;
      for (int i = 0; i < group_size; ++i) {  // the CPU twin's update rule, in the same order
        if (c[i] > first) {
          second = first;
          first = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_scores[g] = !p.top_two_sum ? first : (group_size > 1 ? first + second : first);
      kept[g] = 0;
    }
    __syncwarp();
    unsigned taken = 0;  // bit j: group lane + 32 j is already kept
    for (int k = 0; k < p.topk_groups; ++k) {
      float best = -INFINITY;
      int best_i = INT_MAX;
      for (int j = 0, g = lane; g < p.num_groups; ++j, g += 32) {
        const float v = rank_value(group_scores[g]);
        if (!(taken >> j & 1u) && argmax_better(v, g, best, best_i)) {
          best = v;
          best_i = g;
        }
      }
      warp_argmax(best, best_i);
      if (best_i % 32 == lane) taken |= 1u << (best_i / 32);
      if (lane == 0) kept[best_i] = 1;
    }
    __syncwarp();
  }

  // 3. The top_k selectable experts by choice value.
  unsigned taken = 0;  // bit j: expert lane + 32 j is already chosen
  for (int k = 0; k < p.top_k; ++k) {
    float best = -INFINITY;
    int best_i = INT_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i >= e || (taken >> j & 1u)) continue;
      if (p.num_groups > 1 && !kept[i / group_size]) continue;
      const float v = rank_value(choice[i]);
      if (argmax_better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    warp_argmax(best, best_i);
    if (best_i % 32 == lane) taken |= 1u << (best_i / 32);
    if (lane == 0) chosen[k] = best_i;
  }
  __syncwarp();

  // 4.-5. Weights from the unbiased scores, renormalised (sum in column order, as the CPU) and
  // scaled.
  float sum = 0.0f;
  if (lane == 0) {
    for (int k = 0; k < p.top_k; ++k) sum += scores[chosen[k]];
  }
  const float denominator = __shfl_sync(0xffffffffu, sum, 0) + 1e-20f;
  const int cols = p.top_k + p.shared_slots;
  int32_t* ids = p.ids + row * cols;
  float* weights = p.weights + row * cols;
  for (int k = lane; k < p.top_k; k += 32) {
    float w = scores[chosen[k]];
    if (p.renormalize) w = w / denominator;
    w = w * p.scaling;
    ids[k] = chosen[k];
    weights[k] = w;
  }
  // 6. The fused shared expert: this row's replica, weight exactly 1.
  if (p.shared_slots > 0) {
    const int64_t replica = row % p.shared_replicas;
    for (int j = lane; j < p.shared_slots; j += 32) {
      ids[p.top_k + j] = static_cast<int32_t>(p.shared_first + replica * p.shared_slots + j);
      weights[p.top_k + j] = 1.0f;
    }
  }
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.experts < 1 || p.experts > kMaxRouteExperts || p.num_groups < 1 || p.num_groups > p.experts ||
      p.top_k < 1 || p.top_k > p.experts) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = (p.tokens + kRowsPerBlock - 1) / kRowsPerBlock;
  return launch_overlapped(moe_route_kernel, {dim3(static_cast<unsigned>(blocks)), dim3(kRowsPerBlock * 32)}, stream,
                           p);
}

}  // namespace specula::cuda
