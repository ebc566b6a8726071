// CUDA backend: MoE routing and the fused expert computation — argument checks, then the kernels
// (cuda_moe_route.cu, cuda_fused_moe_gemv.cu, cuda_fused_moe_grouped.cu).
//
// fused_moe picks its path from T * C, which the host knows without a sync: up to
// kGemvMaxPairs (token, column) pairs — decode batches — the GEMV passes, which stream each
// selected expert's weights once per pair; above, the sort + grouped tensor-core GEMM path, which
// streams each expert's weights once per 64 of its rows. Both round identically (see
// cuda_deepseek_kernels.h), so the choice moves results by fp32 summation order only.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_deepseek_kernels.h"

namespace specula {
namespace {

constexpr int64_t kGemvMaxPairs = 64;
// The grouped path's per-pair scratch (gate|up, act, expert output: (3 I + H) bf16) is kept below
// this by running large batches in token chunks.
constexpr int64_t kGroupedScratchBytes = int64_t{256} << 20;

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data()) & 15u) == 0; }

void check_routing(const MoeRouting& p, int64_t experts) {
  SPECULA_CHECK(experts >= 1 && experts <= cuda::kMaxRouteExperts,
                "moe_route: {} experts; the CUDA router handles 1 to {} per row", experts, cuda::kMaxRouteExperts);
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

void CudaBackend::moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& p, Tensor& topk_ids,
                            Tensor& topk_weights) {
  cuda_check::dtype(router_logits, DType::kF32, "moe_route", "router_logits");
  cuda_check::dtype(topk_ids, DType::kI32, "moe_route", "topk_ids");
  cuda_check::dtype(topk_weights, DType::kF32, "moe_route", "topk_weights");
  SPECULA_CHECK(router_logits.ndim() == 2, "moe_route: router_logits {} must be [T, E]", router_logits.describe());
  const int64_t t = router_logits.size(0), e = router_logits.size(1);
  check_routing(p, e);
  const int64_t cols = p.columns();
  SPECULA_CHECK(topk_ids.ndim() == 2 && topk_ids.size(0) == t && topk_ids.size(1) == cols,
                "moe_route: topk_ids {} must be [{}, {}]", topk_ids.describe(), t, cols);
  SPECULA_CHECK(topk_weights.ndim() == 2 && topk_weights.size(0) == t && topk_weights.size(1) == cols,
                "moe_route: topk_weights {} must be [{}, {}]", topk_weights.describe(), t, cols);
  cuda::MoeRouteParams rp;
  if (bias != nullptr) {
    cuda_check::dtype(*bias, DType::kF32, "moe_route", "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == e, "moe_route: bias {} must be [{}]", bias->describe(), e);
    rp.bias = bias->data_as<float>();
  }
  rp.logits = router_logits.data_as<float>();
  rp.ids = topk_ids.data_as<int32_t>();
  rp.weights = topk_weights.data_as<float>();
  rp.tokens = t;
  rp.experts = static_cast<int>(e);
  rp.sigmoid = p.scoring == MoeRouting::Scoring::kSigmoid;
  rp.top_two_sum = p.group_score == MoeRouting::GroupScore::kTopTwoSum;
  rp.top_k = p.top_k;
  rp.num_groups = p.num_groups;
  rp.topk_groups = p.topk_groups;
  rp.renormalize = p.renormalize;
  rp.scaling = p.routed_scaling_factor;
  rp.shared_slots = p.shared_slots;
  rp.shared_replicas = p.shared_replicas;
  rp.shared_first = p.shared_first;
  check_cuda(cuda::launch_moe_route(rp, stream_), "moe_route");
}

void CudaBackend::fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                            const Tensor& topk_weights, Tensor& out) {
  const char* op = "fused_moe";
  cuda_check::dtype(x, DType::kBF16, op, "x");
  cuda_check::dtype(w13, DType::kBF16, op, "w13");
  cuda_check::dtype(w2, DType::kBF16, op, "w2");
  cuda_check::dtype(out, DType::kBF16, op, "out");
  cuda_check::dtype(topk_ids, DType::kI32, op, "topk_ids");
  cuda_check::dtype(topk_weights, DType::kF32, op, "topk_weights");
  SPECULA_CHECK(x.ndim() == 2 && w13.ndim() == 3 && w2.ndim() == 3,
                "fused_moe: x {}, w13 {} and w2 {} must be [T, H], [E, 2I, H] and [E, H, I]", x.describe(),
                w13.describe(), w2.describe());
  const int64_t t = x.size(0), h = x.size(1), e = w13.size(0), inter = w13.size(1) / 2;
  SPECULA_CHECK(w13.size(1) == 2 * inter && w13.size(2) == h && w2.size(0) == e && w2.size(1) == h &&
                    w2.size(2) == inter,
                "fused_moe: w13 {} and w2 {} do not fit x {} ([E, 2I, H] and [E, H, I])", w13.describe(),
                w2.describe(), x.describe());
  SPECULA_CHECK(topk_ids.ndim() == 2 && topk_ids.size(0) == t, "fused_moe: topk_ids {} must be [{}, C]",
                topk_ids.describe(), t);
  const int64_t cols = topk_ids.size(1);
  SPECULA_CHECK(topk_weights.ndim() == 2 && topk_weights.size(0) == t && topk_weights.size(1) == cols,
                "fused_moe: topk_weights {} must be [{}, {}] like topk_ids", topk_weights.describe(), t, cols);
  SPECULA_CHECK(out.ndim() == 2 && out.size(0) == t && out.size(1) == h, "fused_moe: out {} must be [{}, {}]",
                out.describe(), t, h);
  SPECULA_CHECK(out.data() != x.data(), "fused_moe: out must not alias x");
  SPECULA_CHECK(h <= 0x7fffffff && inter <= 0x7fffffff && e <= 0x7fffffff && cols <= 0x7fffffff,
                "fused_moe: dimensions of x {} / w13 {} / topk_ids {} exceed 2^31", x.describe(), w13.describe(),
                topk_ids.describe());
  if (t == 0 || h == 0) return;
  if (cols == 0 || inter == 0 || e == 0) {  // no expert term: an empty sum
    zero(out);
    return;
  }

  cuda::FusedMoeParams p;
  p.x = x.data();
  p.w13 = w13.data();
  p.w2 = w2.data();
  p.ids = topk_ids.data_as<int32_t>();
  p.weights = topk_weights.data_as<float>();
  p.out = out.data();
  p.columns = static_cast<int>(cols);
  p.hidden = static_cast<int>(h);
  p.inter = static_cast<int>(inter);
  p.experts = static_cast<int>(e);
  const bool vec16 =
      h % 8 == 0 && inter % 8 == 0 && aligned16(x) && aligned16(w13) && aligned16(w2) && aligned16(out);
  const int64_t pairs = t * cols;

  if (pairs <= kGemvMaxPairs || !vec16 || e > cuda::kMaxGroupedExperts) {
    p.tokens = t;
    Tensor act = scratch({pairs, inter}, DType::kBF16);
    check_cuda(cuda::launch_fused_moe_gemv(p, act.data(), vec16 && aligned16(act), stream_), "fused_moe (gemv)");
    return;
  }

  // Grouped path, in token chunks that bound the scratch; the buffers are sized once for a chunk.
  const int64_t per_token = cols * (3 * inter + h) * static_cast<int64_t>(sizeof(uint16_t));
  const int64_t chunk = std::clamp<int64_t>(kGroupedScratchBytes / per_token, 1, t);
  const int64_t chunk_pairs = chunk * cols;
  Tensor offsets = scratch({e + 1}, DType::kI32), tile_starts = scratch({e + 1}, DType::kI32);
  Tensor sorted_token = scratch({chunk_pairs}, DType::kI32), pair_row = scratch({chunk_pairs}, DType::kI32);
  Tensor gate_up = scratch({chunk_pairs, 2 * inter}, DType::kBF16), act = scratch({chunk_pairs, inter}, DType::kBF16);
  Tensor expert_out = scratch({chunk_pairs, h}, DType::kBF16);
  cuda::GroupedMoeScratch s;
  s.offsets = offsets.data_as<int32_t>();
  s.tile_starts = tile_starts.data_as<int32_t>();
  s.sorted_token = sorted_token.data_as<int32_t>();
  s.pair_row = pair_row.data_as<int32_t>();
  s.gate_up = gate_up.data();
  s.act = act.data();
  s.expert_out = expert_out.data();
  const size_t x_row = static_cast<size_t>(h) * sizeof(uint16_t);
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    cuda::FusedMoeParams c = p;
    c.tokens = std::min(chunk, t - t0);
    c.x = static_cast<const char*>(x.data()) + t0 * x_row;
    c.out = static_cast<char*>(out.data()) + t0 * x_row;
    c.ids = p.ids + t0 * cols;
    c.weights = p.weights + t0 * cols;
    check_cuda(cuda::launch_fused_moe_grouped(c, s, stream_), "fused_moe (grouped)");
  }
}

}  // namespace specula
