#include "backend/backend.h"

#include <vector>

#include "backend/backend_registry.h"
#include "backend/token_sampler.h"

namespace specula {
namespace {
CudaBackendFactory& cuda_factory() {
  static CudaBackendFactory f;
  return f;
}
}  // namespace

void Backend::copy_many(std::span<const CopyPair> pairs) {
  for (const CopyPair& p : pairs) {
    Tensor dst = p.dst;
    copy(p.src, dst);
  }
}

void Backend::argmax_rows(const Tensor& x, const Tensor* rows, Tensor& out) {
  SPECULA_CHECK(x.is_cpu() && out.is_cpu() && (!rows || rows->is_cpu()),
                "argmax_rows is not implemented by the {} backend for device tensors", name());
  SPECULA_CHECK(x.dtype() == DType::kF32 && x.ndim() == 2, "argmax_rows: x must be F32 [R, V], got {}", x.describe());
  SPECULA_CHECK(out.dtype() == DType::kI32 && out.ndim() == 1, "argmax_rows: out must be I32 [n], got {}",
                out.describe());
  const int64_t n = out.size(0), vocab = x.size(1);
  SPECULA_CHECK(rows ? (rows->dtype() == DType::kI32 && rows->ndim() == 1 && rows->size(0) == n) : n <= x.size(0),
                "argmax_rows: rows {} must be I32 [{}] (or null with out no longer than x's {} rows)",
                rows ? rows->describe() : std::string("null"), n, x.size(0));
  const float* base = x.data_as<float>();
  int32_t* dst = out.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows ? rows->data_as<int32_t>()[i] : i;
    SPECULA_CHECK(r >= 0 && r < x.size(0), "argmax_rows: row {} outside x's {} rows", r, x.size(0));
    const float* row = base + r * vocab;
    int64_t best = 0;  // the host sampler's argmax: the first strictly larger value wins
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    dst[i] = static_cast<int32_t>(best);
  }
}

std::unique_ptr<DeviceEvent> Backend::record_event() {
  struct Synchronizing : DeviceEvent {
    explicit Synchronizing(Backend& b) : backend(b) {}
    void wait() override { backend.synchronize(); }
    Backend& backend;
  };
  return std::make_unique<Synchronizing>(*this);
}

std::unique_ptr<DeviceEvent> Backend::copy_to_host_async(const Tensor& src, Tensor& dst) {
  copy(src, dst);
  return record_event();
}

void Backend::feed_tokens(Tensor& token_ids, const Tensor& source) {
  SPECULA_CHECK(token_ids.is_cpu() && source.is_cpu(), "feed_tokens is not implemented by the {} backend for device tensors",
                name());
  SPECULA_CHECK(token_ids.dtype() == DType::kI32 && source.dtype() == DType::kI32,
                "feed_tokens: token_ids {} and source {} must be I32", token_ids.describe(), source.describe());
  int32_t* ids = token_ids.data_as<int32_t>();
  const int32_t* src = source.data_as<int32_t>();
  for (int64_t i = 0; i < token_ids.numel(); ++i) {
    if (ids[i] >= 0) continue;
    const int64_t at = -(static_cast<int64_t>(ids[i]) + 1);
    SPECULA_CHECK(at < source.numel(), "feed_tokens: entry {} of a source of {}", at, source.numel());
    ids[i] = src[at];
  }
}

void Backend::shift_by_accepted(const AcceptedShift& a) {
  const bool tokens = a.tokens.defined();
  for (const Tensor* t : {&a.inputs, &a.sampled, &a.positions, &a.slots, &a.seq_lens, &a.block_tables})
    SPECULA_CHECK(!t->defined() || t->is_cpu(), "shift_by_accepted is not implemented by the {} backend for device tensors",
                  name());
  SPECULA_CHECK(!a.slots.defined() || a.block_tables.defined(), "shift_by_accepted: slots without block tables");
  SPECULA_CHECK(!tokens || (a.tokens.is_cpu() && a.tokens.dtype() == DType::kI32 && a.entries == 2),
                "shift_by_accepted: tokens {} must be I32 over two entries ({})", a.tokens.describe(), a.entries);
  const int32_t* inputs = a.inputs.data_as<int32_t>();
  const int32_t* sampled = a.sampled.data_as<int32_t>();
  int32_t* positions = a.positions.data_as<int32_t>();
  int64_t* slots = a.slots.defined() ? a.slots.data_as<int64_t>() : nullptr;
  int32_t* seq_lens = a.seq_lens.defined() ? a.seq_lens.data_as<int32_t>() : nullptr;
  const int32_t* tables = a.block_tables.defined() ? a.block_tables.data_as<int32_t>() : nullptr;
  const int64_t width = a.block_tables.defined() ? a.block_tables.size(1) : 0;
  for (int i = 0; i < a.num_requests; ++i) {
    const int64_t row = static_cast<int64_t>(i) * (a.k + 1);
    int accepted = 0;
    while (accepted < a.k && inputs[row + accepted + 1] == sampled[row + accepted]) ++accepted;
    for (int e = 0; e < a.entries; ++e) {
      const int64_t at = static_cast<int64_t>(i) * a.request_stride + static_cast<int64_t>(e) * a.entry_stride;
      const int32_t pos = positions[at] += accepted;
      if (slots && slots[at] >= 0) {
        const int64_t block = pos / a.block_size;
        slots[at] = block < width ? static_cast<int64_t>(tables[i * width + block]) * a.block_size + pos % a.block_size
                                  : -1;
      }
      if (tokens) a.tokens.data_as<int32_t>()[at] = e == 0 ? inputs[row + accepted] : sampled[row + accepted];
      if (seq_lens && (e == 0 || a.seq_lens_entry_stride != 0))
        seq_lens[static_cast<int64_t>(i) * a.seq_lens_request_stride + static_cast<int64_t>(e) * a.seq_lens_entry_stride] +=
            accepted;
    }
  }
}

void Backend::gather_columns(const Tensor& x, const Tensor& columns, float fill, Tensor& out) {
  SPECULA_CHECK(x.is_cpu() && columns.is_cpu() && out.is_cpu(),
                "gather_columns is not implemented by the {} backend for device tensors", name());
  SPECULA_CHECK(x.dtype() == DType::kF32 && x.ndim() == 2 && out.dtype() == DType::kF32 && out.ndim() == 2 &&
                    columns.dtype() == DType::kI32 && columns.ndim() == 1 && out.size(0) == x.size(0) &&
                    out.size(1) == columns.size(0),
                "gather_columns: x {} and out {} must be F32 [R, C] and [R, N], columns {} I32 [N]", x.describe(),
                out.describe(), columns.describe());
  const int64_t rows = x.size(0), c = x.size(1), n = out.size(1);
  const int32_t* col = columns.data_as<int32_t>();
  for (int64_t j = 0; j < n; ++j)
    SPECULA_CHECK(col[j] < c, "gather_columns: column {} of x's {}", col[j], c);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x.data_as<float>() + r * c;
    float* dst = out.data_as<float>() + r * n;
    for (int64_t j = 0; j < n; ++j) dst[j] = col[j] >= 0 ? src[col[j]] : fill;
  }
}

void Backend::linear(const Tensor& x, const LinearWeight& weight, const Tensor* bias, Tensor& out) {
  if (weight.fp8()) {
    linear_fp8(x, weight.weight, weight.scale, bias, out);
  } else {
    linear(x, weight.weight, bias, out);
  }
}

void Backend::fused_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                           const Tensor* bias, Tensor& out, LinearEpilogue epilogue) {
  SPECULA_CHECK(x.ndim() == 2 && out.ndim() == 2 && x.size(0) == out.size(0),
                "fused_linear: x {} and out {} must be [M, *] with the same M", x.describe(), out.describe());
  const size_t mark = scratch_mark();
  Tensor in = x;
  if (prologue.norm_weight != nullptr) {
    in = scratch(x.shape(), x.dtype());
    rms_norm(x, *prologue.norm_weight, prologue.eps, in);
  }
  if (epilogue == LinearEpilogue::kStore) {
    linear(in, weight, bias, out);
  } else {
    const int64_t n = weight.weight.size(0);
    Tensor y = scratch({x.size(0), n}, out.dtype());
    linear(in, weight, bias, y);
    if (epilogue == LinearEpilogue::kAccumulate) {
      add(out, y, out);
    } else {
      silu_mul(y, out);
    }
  }
  scratch_release(mark);
}

// The MLA / MoE / FP8 ops are optional per backend: a backend that lacks one says so by name.
void Backend::linear_fp8(const Tensor&, const Tensor&, const Tensor&, const Tensor*, Tensor&) {
  throw Error(fmt::format("FP8 weights are not supported by the {} backend", name()));
}
void Backend::quantize_fp8_rows(const Tensor&, Tensor&, Tensor&) {
  throw Error(fmt::format("FP8 quantisation is not supported by the {} backend", name()));
}
void Backend::copy_columns(const Tensor&, int64_t, Tensor&, int64_t, int64_t) {
  throw Error(fmt::format("copy_columns is not implemented by the {} backend", name()));
}
void Backend::head_linear(const Tensor&, const Tensor&, Tensor&) {
  throw Error(fmt::format("head_linear is not implemented by the {} backend", name()));
}
void Backend::moe_route(const Tensor&, const Tensor*, const MoeRouting&, Tensor&, Tensor&) {
  throw Error(fmt::format("moe_route is not implemented by the {} backend", name()));
}
void Backend::fused_moe(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  throw Error(fmt::format("fused_moe is not implemented by the {} backend", name()));
}

Backend::HeadLinearShape Backend::head_linear_shape(const Tensor& x, const Tensor& weight, const Tensor& out) {
  SPECULA_CHECK(x.defined() && weight.defined() && out.defined() && x.ndim() == 3 && weight.ndim() == 3 &&
                    out.ndim() == 3,
                "head_linear: x {}, weight {} and out {} must be [T, Hh, Kx], [Hh, N, K] and [T, Hh, No]",
                x.describe(), weight.describe(), out.describe());
  const HeadLinearShape s{x.size(0), x.size(1), x.size(2), weight.size(2), weight.size(1), out.size(2)};
  SPECULA_CHECK(weight.size(0) == s.heads && s.k <= s.kx && out.size(0) == s.tokens && out.size(1) == s.heads &&
                    s.n <= s.no,
                "head_linear: x {}, weight {} and out {} do not fit [T, Hh, Kx >= K] x [Hh, N, K] -> [T, Hh, No >= N]",
                x.describe(), weight.describe(), out.describe());
  return s;
}

Backend::MlaPrologueShape Backend::mla_prologue_shape(const Tensor& q, const Tensor& kv_a, const MlaPrologue& p,
                                                      const Tensor& q_mla) {
  SPECULA_CHECK(p.num_heads > 0 && p.nope_dim >= 0 && p.rope_dim > 0 && p.kv_norm && p.positions && p.cos_sin,
                "mla_prologue: head count, dims, kv_norm, positions and cos_sin are required");
  const int64_t hq = p.num_heads, dn = p.nope_dim, dr = p.rope_dim;
  SPECULA_CHECK(q.defined() && kv_a.defined() && q.ndim() == 2 && kv_a.ndim() == 2 && q.size(0) == kv_a.size(0) &&
                    q.size(1) == hq * (dn + dr) && kv_a.size(1) > dr,
                "mla_prologue: q {} must be [T, {} x ({} + {})] and kv_a {} [T, C + {}]", q.describe(), hq, dn, dr,
                kv_a.describe(), dr);
  const MlaPrologueShape s{q.size(0), kv_a.size(1) - dr};
  SPECULA_CHECK(q_mla.defined() && q_mla.ndim() == 3 && q_mla.size(0) == s.tokens && q_mla.size(1) == hq &&
                    q_mla.size(2) == s.latent + dr,
                "mla_prologue: q_mla {} must be [{}, {}, {}]", q_mla.describe(), s.tokens, hq, s.latent + dr);
  return s;
}

// The reference form of the MLA prologue: the column copies, norm, rope and cache write it fuses.
void Backend::mla_prologue(const Tensor& q, const Tensor& kv_a, const MlaPrologue& p, KVCacheLayer& cache,
                           const Tensor& slot_mapping, Tensor& q_mla) {
  const MlaPrologueShape shape = mla_prologue_shape(q, kv_a, p, q_mla);
  const int64_t hq = p.num_heads, dn = p.nope_dim, dr = p.rope_dim;
  const int64_t t = shape.tokens, latent = shape.latent, entry = latent + dr;
  const DType dt = q.dtype();
  const size_t mark = scratch_mark();
  Tensor q_pe = scratch({t, hq, dr}, dt);
  copy_columns(q.reshape({t * hq, dn + dr}), dn, q_pe, 0, dr);
  Tensor latent_raw = scratch({t, latent}, dt), normed = scratch({t, latent}, dt), k_pe = scratch({t, 1, dr}, dt);
  copy_columns(kv_a, 0, latent_raw, 0, latent);
  copy_columns(kv_a, latent, k_pe, 0, dr);
  rms_norm(latent_raw, *p.kv_norm, p.eps, normed);
  rope(q_pe, k_pe, *p.positions, *p.cos_sin, static_cast<int>(dr), p.neox);
  Tensor kv_entry = scratch({t, 1, entry}, dt);
  copy_columns(normed, 0, kv_entry, 0, latent);
  copy_columns(k_pe, 0, kv_entry, latent, dr);
  write_kv_cache(kv_entry, Tensor(), cache, slot_mapping);
  copy_columns(q_pe, 0, q_mla, latent, dr);
  scratch_release(mark);
}

// The reference form of the EAGLE-3 layer input: the ops it stands for, one by one.
void Backend::eagle3_layer_input(const Tensor& token_ids, const Tensor& g, const Eagle3LayerInput& p, Tensor& x,
                                 Tensor& residual) {
  SPECULA_CHECK(p.embed_tokens && p.input_norm && p.hidden_norm, "eagle3_layer_input: the embedding and both norms "
                "are required");
  SPECULA_CHECK(g.defined() && g.ndim() == 2, "eagle3_layer_input: g must be [T, H], got {}", g.describe());
  const int64_t t = g.size(0), h = g.size(1);
  SPECULA_CHECK(x.defined() && x.ndim() == 2 && x.size(0) == t && x.size(1) == 2 * h && residual.defined() &&
                    residual.numel() == t * h,
                "eagle3_layer_input: x {} must be [{}, {}] and residual {} [{}, {}]", x.describe(), t, 2 * h,
                residual.describe(), t, h);
  const size_t mark = scratch_mark();
  Tensor e = scratch({t, h}, g.dtype()), e_norm = scratch({t, h}, g.dtype()), g_norm = scratch({t, h}, g.dtype());
  embedding(token_ids, *p.embed_tokens, e);
  rms_norm(e, *p.input_norm, p.eps, e_norm);
  rms_norm(g, *p.hidden_norm, p.eps, g_norm);
  copy(p.norm_before_residual ? g_norm : g, residual);
  copy_columns(e_norm, 0, x, 0, h);
  copy_columns(g_norm, 0, x, h, h);
  scratch_release(mark);
}

// The reference form of the fused projection: the two ops it fuses.
void Backend::qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight,
                             const Tensor* bias, const QkvPrologue& params, KVCacheLayer& cache,
                             const Tensor& slot_mapping, Tensor& q_out) {
  SPECULA_CHECK(x.defined() && x.ndim() == 2 && weight.weight.defined() && weight.weight.ndim() == 2,
                "qkv_projection: x {} must be [T, K] and the weight [(Hq + 2 Hk) D, K]", x.describe());
  const size_t mark = scratch_mark();
  Tensor qkv = scratch({x.size(0), weight.weight.size(0)}, x.dtype());
  fused_linear(x, input_norm, weight, bias, qkv, LinearEpilogue::kStore);
  qkv_prologue(qkv, params, cache, slot_mapping, q_out);
  scratch_release(mark);
}

// The reference form of the fused prologue: split the heads with gather_rows, normalise, rope,
// write the cache, each as its own op. Backends without a fused kernel (the CPU) run exactly this.
void Backend::qkv_prologue(const Tensor& qkv, const QkvPrologue& p, KVCacheLayer& cache, const Tensor& slot_mapping,
                           Tensor& q_out) {
  SPECULA_CHECK(qkv.defined() && qkv.ndim() == 2, "qkv_prologue: qkv must be [T, (Hq + 2 Hk) D], got {}",
                qkv.describe());
  SPECULA_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.positions && p.cos_sin,
                "qkv_prologue: head counts, positions and cos_sin are required");
  const int64_t t = qkv.size(0), hq = p.num_q_heads, hk = p.num_kv_heads, per_token = hq + 2 * hk;
  SPECULA_CHECK(qkv.size(1) % per_token == 0, "qkv_prologue: qkv {} is not {} heads per token", qkv.describe(),
                per_token);
  const int64_t d = qkv.size(1) / per_token;
  SPECULA_CHECK(q_out.defined() && q_out.numel() == t * hq * d, "qkv_prologue: q_out {} must be [{}, {}, {}]",
                q_out.describe(), t, hq, d);
  std::vector<int32_t> qi(static_cast<size_t>(t * hq)), ki(static_cast<size_t>(t * hk)), vi(ki.size());
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < hq; ++h) qi[i * hq + h] = static_cast<int32_t>(i * per_token + h);
    for (int64_t h = 0; h < hk; ++h) {
      ki[i * hk + h] = static_cast<int32_t>(i * per_token + hq + h);
      vi[i * hk + h] = static_cast<int32_t>(i * per_token + hq + hk + h);
    }
  }
  auto upload = [&](const std::vector<int32_t>& host) {
    Tensor dst = empty({static_cast<int64_t>(host.size())}, DType::kI32);
    copy(Tensor::from_i32(host), dst);
    return dst;
  };
  const Tensor heads = qkv.reshape({t * per_token, d});
  const DType dt = qkv.dtype();
  Tensor q = q_out.reshape({t * hq, d});
  Tensor k = scratch({t * hk, d}, dt), v = scratch({t * hk, d}, dt);
  gather_rows(heads, upload(qi), q);
  gather_rows(heads, upload(ki), k);
  gather_rows(heads, upload(vi), v);
  if (p.q_norm) rms_norm(q, *p.q_norm, p.eps, q);  // rms_norm may run in place
  if (p.k_norm) rms_norm(k, *p.k_norm, p.eps, k);
  Tensor q3 = q.reshape({t, hq, d}), k3 = k.reshape({t, hk, d}), v3 = v.reshape({t, hk, d});
  rope(q3, k3, *p.positions, *p.cos_sin, p.rotary_dim, p.neox);
  write_kv_cache(k3, v3, cache, slot_mapping);
}

std::unique_ptr<TokenSampler> Backend::make_token_sampler(int, int64_t) { return nullptr; }

void register_cuda_backend_factory(CudaBackendFactory factory) { cuda_factory() = std::move(factory); }

bool cuda_available() { return cuda_factory().available && cuda_factory().available(); }

int cuda_device_count() { return cuda_available() && cuda_factory().device_count ? cuda_factory().device_count() : 0; }

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              bool custom_all_reduce) {
  SPECULA_CHECK(!ranks.empty(), "tensor parallel: no ranks");
  const Device device = ranks.front()->device();
  for (const Backend* b : ranks)
    SPECULA_CHECK(b->device() == device, "tensor parallel: ranks on {} and {} backends", ranks.front()->name(),
                  b->name());
  if (device == Device::kCPU) return make_thread_communicators(static_cast<int>(ranks.size()));
  SPECULA_CHECK(cuda_factory().make_communicators, "tensor parallel: this specula was built without CUDA");
  return cuda_factory().make_communicators(ranks, custom_all_reduce);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  SPECULA_CHECK(cuda_factory().make, "this specula was built without CUDA (nvcc was not found at build time)");
  SPECULA_CHECK(cuda_available(), "no CUDA GPU is visible");
  return cuda_factory().make(device_index);
}

}  // namespace specula
