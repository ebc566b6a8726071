// CUDA backend: Backend::decoder_forward as one persistent kernel (cuda_decoder_forward.cu), for
// bf16 Llama-family decoders and batches of up to 16 rows; anything else returns false and the
// caller runs the layers one by one.
// Opt-in (SPECULA_FUSED_DECODER_FORWARD=1, read on every call so that tests and benchmarks can
// switch): on the H200 it is still slower than the layer-by-layer step it would replace
// (Qwen3-0.6B batch 1 1.31-1.34 against 0.97-0.98 ms, the embedded model 0.23 against 0.17 ms;
// docs/PERFORMANCE.md, "A persistent decoder forward"), each of its five phases a layer taking 3-9 us where its
// weights take 1-3. SPECULA_FUSED_FORWARD_BLOCKS=N sets the blocks; SPECULA_FUSED_FORWARD_TRACE=1
// logs where a step's time goes when the backend is destroyed.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decoder_forward.h"
#include "backend/cuda/cuda_decoder_weights.h"
#include "core/logging.h"

namespace specula {
namespace {

// Weight bytes a block's share of a layer should hold at least: smaller models take fewer blocks,
// whose barriers are cheaper (the embedded 8-layer model's 1.4 MB layer: 43 blocks).
constexpr int64_t kLayerBytesPerBlock = 32 << 10;
constexpr int kMinBlocks = 16;

bool fused_forward_enabled() {
  const char* v = std::getenv("SPECULA_FUSED_DECODER_FORWARD");
  return v && std::strcmp(v, "1") == 0;
}

int blocks_override() {
  const char* v = std::getenv("SPECULA_FUSED_FORWARD_BLOCKS");
  return v ? std::atoi(v) : 0;
}

}  // namespace

bool CudaBackend::decoder_forward(DecoderForward& f) {
  FusedDecoderDims dims;
  if (!fused_forward_enabled() || f.hidden_norm || !f.kv || !f.attn || !f.token_ids || !f.positions ||
      !f.logits_indices || f.layers.size() > static_cast<size_t>(cuda::kMaxForwardLayers) ||
      !fused_decoder_dims(f, dims) || !fused_kv_fits(f, *f.kv, f.attn->block_size))
    return false;
  const AttentionMetadata& md = *f.attn;
  const int64_t rows = f.token_ids->numel(), logits_rows = f.logits_indices->numel();
  const int64_t gq = f.num_q_heads / f.num_kv_heads;
  if (rows < 1 || rows > cuda::kMaxForwardRows || logits_rows > cuda::kMaxForwardRows || md.num_seqs < 1 ||
      gq * dims.head_dim > 2048)
    return false;
  SPECULA_CHECK(f.token_ids->dtype() == DType::kI32 && f.positions->dtype() == DType::kI32 &&
                    f.positions->numel() == rows && md.slot_mapping.dtype() == DType::kI64 &&
                    md.slot_mapping.numel() >= rows && md.query_start_loc.numel() >= md.num_seqs + 1 &&
                    md.seq_lens.numel() >= md.num_seqs && md.block_tables.ndim() == 2 &&
                    md.block_tables.size(0) >= md.num_seqs && f.logits_indices->dtype() == DType::kI32,
                "decoder_forward: a batch of {} rows, {} sequences: positions {}, slot_mapping {}, query_start_loc {}, "
                "seq_lens {}, block_tables {}, logits_indices {}",
                rows, md.num_seqs, f.positions->describe(), md.slot_mapping.describe(), md.query_start_loc.describe(),
                md.seq_lens.describe(), md.block_tables.describe(), f.logits_indices->describe());
  SPECULA_CHECK(f.grid_sync.dtype() == DType::kI32 && f.grid_sync.numel() >= 2 && f.grid_sync.device() == Device::kCUDA,
                "decoder_forward: grid_sync {} must be I32 [2] on the GPU", f.grid_sync.describe());

  cuda::DecoderForwardParams p;
  p.num_layers = static_cast<int>(f.layers.size());
  fill_fused_layers(f, *f.kv, p.layers);
  p.embed = static_cast<const __nv_bfloat16*>(f.embed_tokens->data());
  p.final_norm = static_cast<const __nv_bfloat16*>(f.norm->data());
  p.lm_head = static_cast<const __nv_bfloat16*>(f.lm_head->data());
  p.cos_sin = f.cos_sin->data_as<float>();
  p.rotary_dim = f.rotary_dim;
  p.max_pos = static_cast<int>(f.cos_sin->size(0));
  p.hidden = static_cast<int>(dims.hidden);
  p.num_q_heads = static_cast<int>(f.num_q_heads);
  p.num_kv_heads = static_cast<int>(f.num_kv_heads);
  p.head_dim = static_cast<int>(dims.head_dim);
  p.intermediate = static_cast<int>(dims.intermediate);
  p.vocab = static_cast<int>(dims.vocab);
  p.eps = f.eps;
  p.scale = f.attn_scale;
  p.rows = static_cast<int>(rows);
  p.num_seqs = md.num_seqs;
  p.token_ids = f.token_ids->data_as<int32_t>();
  p.positions = f.positions->data_as<int32_t>();
  p.slots = md.slot_mapping.data_as<int64_t>();
  p.query_start_loc = md.query_start_loc.data_as<int32_t>();
  p.seq_lens = md.seq_lens.data_as<int32_t>();
  p.block_tables = md.block_tables.data_as<int32_t>();
  p.table_width = static_cast<int>(md.block_tables.size(1));
  p.block_size = md.block_size;
  p.num_slots = f.kv->front().k.size(0) * md.block_size;
  p.logits_indices = f.logits_indices->data_as<int32_t>();
  p.num_logits = static_cast<int>(logits_rows);

  const int64_t layer_bytes =
      2 * dims.hidden * (dims.q_width + 2 * dims.kv_width + dims.q_width + 3 * dims.intermediate);
  int blocks = blocks_override();
  if (blocks <= 0)
    blocks = static_cast<int>(std::clamp<int64_t>(layer_bytes / kLayerBytesPerBlock, kMinBlocks, sm_count_));
  const int64_t smem = cuda::decoder_forward_smem(p, blocks);
  if (smem > smem_budget_) return false;
  const auto key = std::make_pair(std::max(p.rows, p.num_logits), smem);
  auto [it, added] = forward_blocks_fit_.try_emplace(key, 0);
  if (added) it->second = cuda::decoder_forward_max_blocks(p, smem);
  blocks = std::min(blocks, it->second);
  if (blocks < 1) return false;

  // Held until the launch is queued: a request the scratch arena cannot fit gets its own
  // allocation, which goes back (stream-ordered) with its tensor.
  const Tensor x = scratch({rows, dims.hidden}, DType::kF32);
  const Tensor qkv = scratch({rows, dims.q_width + 2 * dims.kv_width}, DType::kF32);
  const Tensor act = scratch({rows, dims.intermediate}, DType::kBF16);
  const Tensor partials = scratch({rows * f.num_q_heads * cuda::kMaxForwardSplits * (dims.head_dim + 2)}, DType::kF32);
  p.x = static_cast<float*>(x.data());
  p.qkv = static_cast<float*>(qkv.data());
  p.act = static_cast<__nv_bfloat16*>(act.data());
  p.partials = static_cast<float*>(partials.data());
  f.logits = scratch({logits_rows, dims.vocab}, DType::kF32);
  f.hidden_states = scratch({rows, dims.hidden}, DType::kBF16);
  p.logits = f.logits.data_as<float>();
  p.hidden_out = static_cast<__nv_bfloat16*>(f.hidden_states.data());
  p.grid_sync = reinterpret_cast<unsigned*>(f.grid_sync.data());
  p.trace = forward_trace_;
  traced_blocks_ = blocks;
  traced_layers_ = p.num_layers;
  check_cuda(cuda::launch_decoder_forward(p, blocks, smem, stream_), "decoder_forward");
  if (!forward_logged_) {
    LOG_INFO("Fused decoder forward: {} layers in one launch of {} blocks ({} KiB shared memory each) for batches of "
             "up to {} rows",
             p.num_layers, blocks, smem / 1024, cuda::kMaxForwardRows);
    forward_logged_ = true;
  }
  return true;
}

// Per phase, the median over layers 1.. of the phase's span (the first block's release from the
// previous barrier to the last block's end) and of the barrier's (the last arrival to the first
// release), in microseconds.
void CudaBackend::report_forward_trace() {
  if (!forward_trace_ || traced_blocks_ <= 0) return;
  const int events = cuda::kForwardTraceEvents, blocks = traced_blocks_, layers = traced_layers_;
  std::vector<unsigned long long> t(static_cast<size_t>(blocks) * events);
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(t.data(), forward_trace_, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  auto first = [&](int e) {
    unsigned long long v = ~0ull;
    for (int b = 0; b < blocks; ++b) v = std::min(v, t[static_cast<size_t>(b) * events + e]);
    return v;
  };
  auto last = [&](int e) {
    unsigned long long v = 0;
    for (int b = 0; b < blocks; ++b) v = std::max(v, t[static_cast<size_t>(b) * events + e]);
    return v;
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  static const char* names[] = {"A qkv", "C attention", "D merge+o_proj", "E gate_up", "F down"};
  std::string line;
  for (int ph = 0; ph < 5; ++ph) {
    std::vector<double> span, wait;
    for (int l = 1; l < layers; ++l) {
      const int end = 1 + (l * 5 + ph) * 2, prev_release = end - 1;
      span.push_back((static_cast<double>(last(end)) - static_cast<double>(first(prev_release))) / 1e3);
      wait.push_back((static_cast<double>(first(end + 1)) - static_cast<double>(last(end))) / 1e3);
    }
    line += fmt::format("{}: {:.2f} + barrier {:.2f} us; ", names[ph], median(span), median(wait));
  }
  const double total = (static_cast<double>(last(events - 1)) - static_cast<double>(first(0))) / 1e3;
  const double lm = (static_cast<double>(last(events - 1)) - static_cast<double>(first(layers * 10))) / 1e3;
  LOG_INFO("Fused decoder forward trace ({} blocks, {} layers): {}lm_head {:.2f} us; whole {:.2f} us", blocks, layers,
           line, lm, total);
  cudaFree(forward_trace_);
  forward_trace_ = nullptr;
}

}  // namespace specula
