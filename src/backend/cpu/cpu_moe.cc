// CPU backend: mixture-of-experts routing and the fused expert computation.
//
// moe_route follows MoeRouting's numbered steps (backend.h) row by row. fused_moe has the shape
// the CUDA grouped GEMM will have: the (token, slot) pairs are sorted by expert (a counting sort,
// stable, so each expert sees its tokens in order), each expert runs two GEMMs over its rows
// (gate|up, then down), and a final pass sums every token's slots in slot order with their
// weights. Sorting first makes each expert's outputs one contiguous block that its GEMM writes in
// place, and the per-token sum in a fixed order makes the result independent of thread timing.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

// The indices of the `count` largest values among those with allowed[i], best first; ties go to
// the lower index (a deterministic stand-in for torch.topk's unspecified order).
void top_indices(const float* values, const std::vector<char>& allowed, int count, int* out) {
  const int n = static_cast<int>(allowed.size());
  std::vector<char> taken(n, 0);
  for (int k = 0; k < count; ++k) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (!allowed[i] || taken[i]) continue;
      if (best < 0 || values[i] > values[best]) best = i;
    }
    out[k] = best;
    taken[best] = 1;
  }
}

void check_routing(const MoeRouting& p, int64_t experts) {
  SPECULA_CHECK(p.num_groups >= 1 && experts % p.num_groups == 0,
                "moe_route: num_groups {} must divide the {} experts", p.num_groups, experts);
  SPECULA_CHECK(p.topk_groups >= 1 && p.topk_groups <= p.num_groups, "moe_route: topk_groups {} must be in [1, {}]",
                p.topk_groups, p.num_groups);
  const int64_t selectable = experts / p.num_groups * p.topk_groups;
  SPECULA_CHECK(p.top_k >= 1 && p.top_k <= selectable,
                "moe_route: top_k {} must be in [1, {}] (the experts of the {} kept groups)", p.top_k, selectable,
                p.topk_groups);
  SPECULA_CHECK(p.shared_slots >= 0, "moe_route: shared_slots must not be negative, got {}", p.shared_slots);
  SPECULA_CHECK(p.shared_slots == 0 || (p.shared_replicas >= 1 && p.shared_first >= 0),
                "moe_route: shared-expert fusion needs shared_replicas >= 1 and shared_first >= 0 (got {}, {})",
                p.shared_replicas, p.shared_first);
}

}  // namespace

void CpuBackend::moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& p, Tensor& topk_ids,
                           Tensor& topk_weights) {
  cpu_check::f32(router_logits, "moe_route", "router_logits");
  cpu_check::f32(topk_weights, "moe_route", "topk_weights");
  SPECULA_CHECK(router_logits.ndim() == 2, "moe_route: router_logits {} must be [T, E]", router_logits.describe());
  const int64_t t = router_logits.size(0), e = router_logits.size(1);
  check_routing(p, e);
  const int64_t cols = p.columns();
  SPECULA_CHECK(topk_ids.defined() && topk_ids.is_cpu() && topk_ids.dtype() == DType::kI32 && topk_ids.ndim() == 2 &&
                    topk_ids.size(0) == t && topk_ids.size(1) == cols,
                "moe_route: topk_ids {} must be an I32 CPU tensor [{}, {}]", topk_ids.describe(), t, cols);
  SPECULA_CHECK(topk_weights.ndim() == 2 && topk_weights.size(0) == t && topk_weights.size(1) == cols,
                "moe_route: topk_weights {} must be [{}, {}]", topk_weights.describe(), t, cols);
  const float* b = nullptr;
  if (bias != nullptr) {
    cpu_check::f32(*bias, "moe_route", "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == e, "moe_route: bias {} must be [{}]", bias->describe(), e);
    b = bias->data_as<float>();
  }
  const float* logits = router_logits.data_as<float>();
  int32_t* ids = topk_ids.data_as<int32_t>();
  float* weights = topk_weights.data_as<float>();
  const int64_t group_size = e / p.num_groups;

#pragma omp parallel num_threads(threads_) if (t * e > 16384)
  {
    std::vector<float> scores(e), choice(e), group_scores(p.num_groups);
    std::vector<char> selectable(e), all_groups(p.num_groups, 1);
    std::vector<int> chosen(p.top_k), kept_groups(p.topk_groups);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < t; ++row) {
      const float* l = logits + row * e;
      // 1. scores (fp32, as torch's softmax / sigmoid), and the biased choice values.
      if (p.scoring == MoeRouting::Scoring::kSoftmax) {
        const float m = *std::max_element(l, l + e);
        float sum = 0.0f;
        for (int64_t i = 0; i < e; ++i) sum += (scores[i] = std::exp(l[i] - m));
        for (int64_t i = 0; i < e; ++i) scores[i] /= sum;
      } else {
        for (int64_t i = 0; i < e; ++i) scores[i] = 1.0f / (1.0f + std::exp(-l[i]));
      }
      for (int64_t i = 0; i < e; ++i) choice[i] = b != nullptr ? scores[i] + b[i] : scores[i];

      // 2. group-limited selection.
      std::fill(selectable.begin(), selectable.end(), 1);
      if (p.num_groups > 1) {
        for (int g = 0; g < p.num_groups; ++g) {
          const float* c = choice.data() + g * group_size;
          if (p.group_score == MoeRouting::GroupScore::kMax) {
            group_scores[g] = *std::max_element(c, c + group_size);
          } else {  // the two largest (the only one when a group holds one expert)
            float first = -std::numeric_limits<float>::infinity(), second = first;
            for (int64_t i = 0; i < group_size; ++i) {
              if (c[i] > first) {
                second = first;
                first = c[i];
              } else if (c[i] > second) {
                second = c[i];
              }
            }
            group_scores[g] = group_size > 1 ? first + second : first;
          }
        }
        top_indices(group_scores.data(), all_groups, p.topk_groups, kept_groups.data());
        std::fill(selectable.begin(), selectable.end(), 0);
        for (int g : kept_groups) std::fill_n(selectable.begin() + g * group_size, group_size, 1);
      }

      // 3. top_k by choice; weights from the unbiased scores. 4. renormalize. 5. scale.
      top_indices(choice.data(), selectable, p.top_k, chosen.data());
      int32_t* row_ids = ids + row * cols;
      float* row_w = weights + row * cols;
      float sum = 0.0f;
      for (int k = 0; k < p.top_k; ++k) {
        row_ids[k] = chosen[k];
        row_w[k] = scores[chosen[k]];
        sum += row_w[k];
      }
      const float denominator = sum + 1e-20f;
      for (int k = 0; k < p.top_k; ++k) {
        if (p.renormalize) row_w[k] /= denominator;
        row_w[k] *= p.routed_scaling_factor;
      }
      // 6. the fused shared expert: one replica per row, weight 1.
      const int64_t replica = p.shared_slots > 0 ? row % p.shared_replicas : 0;
      for (int j = 0; j < p.shared_slots; ++j) {
        row_ids[p.top_k + j] = static_cast<int32_t>(p.shared_first + replica * p.shared_slots + j);
        row_w[p.top_k + j] = 1.0f;
      }
    }
  }
}

void CpuBackend::fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                           const Tensor& topk_weights, Tensor& out) {
  cpu_check::f32(x, "fused_moe", "x");
  cpu_check::f32(w13, "fused_moe", "w13");
  cpu_check::f32(w2, "fused_moe", "w2");
  cpu_check::f32(topk_weights, "fused_moe", "topk_weights");
  cpu_check::f32(out, "fused_moe", "out");
  SPECULA_CHECK(x.ndim() == 2 && w13.ndim() == 3 && w2.ndim() == 3,
                "fused_moe: x {}, w13 {} and w2 {} must be [T, H], [E, 2I, H] and [E, H, I]", x.describe(),
                w13.describe(), w2.describe());
  const int64_t t = x.size(0), h = x.size(1), e = w13.size(0), inter = w13.size(1) / 2;
  SPECULA_CHECK(w13.size(1) == 2 * inter && w13.size(2) == h && w2.size(0) == e && w2.size(1) == h &&
                    w2.size(2) == inter,
                "fused_moe: w13 {} and w2 {} do not fit x {} ([E, 2I, H] and [E, H, I])", w13.describe(),
                w2.describe(), x.describe());
  SPECULA_CHECK(topk_ids.defined() && topk_ids.is_cpu() && topk_ids.dtype() == DType::kI32 && topk_ids.ndim() == 2 &&
                    topk_ids.size(0) == t,
                "fused_moe: topk_ids {} must be an I32 CPU tensor [{}, C]", topk_ids.describe(), t);
  const int64_t cols = topk_ids.size(1);
  SPECULA_CHECK(topk_weights.ndim() == 2 && topk_weights.size(0) == t && topk_weights.size(1) == cols,
                "fused_moe: topk_weights {} must be [{}, {}] like topk_ids", topk_weights.describe(), t, cols);
  SPECULA_CHECK(out.ndim() == 2 && out.size(0) == t && out.size(1) == h, "fused_moe: out {} must be [{}, {}]",
                out.describe(), t, h);
  SPECULA_CHECK(out.data() != x.data(), "fused_moe: out must not alias x");
  const int32_t* ids = topk_ids.data_as<int32_t>();
  for (int64_t i = 0; i < t * cols; ++i) {
    SPECULA_CHECK(ids[i] >= 0 && ids[i] < e, "fused_moe: expert id {} at row {} slot {} is outside [0, {})", ids[i],
                  i / cols, i % cols, e);
  }
  if (t == 0) return;
  const float* xp = x.data_as<float>();
  const float* w13p = w13.data_as<float>();
  const float* w2p = w2.data_as<float>();
  const float* wp = topk_weights.data_as<float>();
  float* op = out.data_as<float>();
  if (cols == 0 || inter == 0) {
    std::memset(op, 0, out.nbytes());
    return;
  }

  // Tokens are taken in chunks so that the per-pair outputs stay within ~64 MiB.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, cols * h));
  std::vector<int64_t> offsets(e + 1), order, position;
  std::vector<float> expert_out;
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t n_tok = std::min(chunk, t - t0), pairs = n_tok * cols;
    const int32_t* cids = ids + t0 * cols;
    // Counting sort of the pairs by expert: order[pos] = pair, position[pair] = pos.
    std::fill(offsets.begin(), offsets.end(), 0);
    for (int64_t p = 0; p < pairs; ++p) ++offsets[cids[p] + 1];
    for (int64_t i = 0; i < e; ++i) offsets[i + 1] += offsets[i];
    order.assign(pairs, 0);
    position.assign(pairs, 0);
    std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) {
      position[p] = fill[cids[p]]++;
      order[position[p]] = p;
    }
    expert_out.resize(static_cast<size_t>(pairs * h));

    // One expert per task: gather its tokens, gate|up GEMM, SiLU * up, down GEMM into its rows.
#pragma omp parallel num_threads(threads_)
    {
      std::vector<float> rows, gate_up, act;
#pragma omp for schedule(dynamic, 1)
      for (int64_t ex = 0; ex < e; ++ex) {
        const int64_t begin = offsets[ex], n = offsets[ex + 1] - begin;
        if (n == 0) continue;
        rows.resize(static_cast<size_t>(n * h));
        gate_up.resize(static_cast<size_t>(n * 2 * inter));
        act.resize(static_cast<size_t>(n * inter));
        for (int64_t r = 0; r < n; ++r) {
          const int64_t token = t0 + order[begin + r] / cols;
          std::memcpy(rows.data() + r * h, xp + token * h, h * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(2 * inter),
                    static_cast<blasint>(h), 1.0f, rows.data(), static_cast<blasint>(h), w13p + ex * 2 * inter * h,
                    static_cast<blasint>(h), 0.0f, gate_up.data(), static_cast<blasint>(2 * inter));
        for (int64_t r = 0; r < n; ++r) {
          const float* gate = gate_up.data() + r * 2 * inter;
          const float* up = gate + inter;
          for (int64_t i = 0; i < inter; ++i) {
            const float g = gate[i];
            act[r * inter + i] = g / (1.0f + std::exp(-g)) * up[i];  // silu(g) * up, as silu_mul
          }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(h),
                    static_cast<blasint>(inter), 1.0f, act.data(), static_cast<blasint>(inter), w2p + ex * h * inter,
                    static_cast<blasint>(inter), 0.0f, expert_out.data() + begin * h, static_cast<blasint>(h));
      }
    }

    // The weighted un-permute: each token sums its slots in slot order.
#pragma omp parallel for num_threads(threads_) schedule(static) if (n_tok * cols * h > 65536)
    for (int64_t i = 0; i < n_tok; ++i) {
      float* o = op + (t0 + i) * h;
      std::memset(o, 0, h * sizeof(float));
      for (int64_t c = 0; c < cols; ++c) {
        const float w = wp[(t0 + i) * cols + c];
        const float* y = expert_out.data() + position[i * cols + c] * h;
        for (int64_t j = 0; j < h; ++j) o[j] += w * y[j];
      }
    }
  }
}

}  // namespace specula
