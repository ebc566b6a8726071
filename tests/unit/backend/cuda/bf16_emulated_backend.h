// A CPU backend that stores every weight, activation and KV entry in bf16 and computes each op in
// fp32, rounding where the CUDA backend rounds: the exact-arithmetic model of "bf16 storage, fp32
// accumulation". The whole-model GPU tests use it to tell bf16 rounding (which it has too) from
// kernel errors (which it does not): on fixtures with large random weights the rounding alone
// moves logits by several percent, so the GPU is held to the emulator, and to transformers only
// as closely as the emulator itself gets.
#pragma once

#include <cstring>
#include <memory>

#include "backend/backend.h"
#include "core/dtype.h"
#include "moe_reference.h"

namespace specula::testing {

class Bf16EmulatedBackend final : public Backend {
 public:
  Bf16EmulatedBackend() : cpu_(make_cpu_backend(2)) {}

  Device device() const override { return Device::kCPU; }
  std::string name() const override { return "cpu emulating bf16 storage"; }
  DType compute_dtype() const override { return DType::kBF16; }

  Tensor empty(Shape shape, DType dtype) override { return cpu_->empty(std::move(shape), dtype); }
  Tensor scratch(Shape shape, DType dtype) override { return cpu_->scratch(std::move(shape), dtype); }
  void reset_scratch() override { cpu_->reset_scratch(); }
  void copy(const Tensor& src, Tensor& dst) override { cpu_->copy(src, dst); }
  void cast(const Tensor& src, Tensor& dst) override { cpu_->cast(src, dst); }
  void zero(Tensor& t) override { cpu_->zero(t); }
  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override {
    cpu_->gather_rows(table, ids, out);  // an exact row copy in any dtype
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    Tensor o = f32_like(out);
    cpu_->rms_norm(f32(x), f32(weight), eps, o);
    store(o, out);
  }
  void add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) override {
    // As the GPU does: the stored (rounded) residual is what gets normalised.
    Tensor r = f32_like(residual);
    cpu_->add(f32(x), f32(residual), r);
    store(r, residual);
    Tensor o = f32_like(x);
    cpu_->rms_norm(f32(residual), f32(weight), eps, o);
    store(o, x);
  }
  void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) override {
    Tensor o = f32_like(out);
    Tensor b = bias ? f32(*bias) : Tensor();
    cpu_->linear(f32(x), f32(weight), bias ? &b : nullptr, o);
    store(o, out);
  }
  void rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& cos_sin, int rotary_dim,
            bool neox) override {
    Tensor qf = f32(q), kf = f32(k);
    cpu_->rope(qf, kf, positions, cos_sin, rotary_dim, neox);
    store(qf, q);
    store(kf, k);
  }
  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    Tensor o = f32_like(out);
    cpu_->silu_mul(f32(gate_up), o);
    store(o, out);
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    Tensor o = f32_like(out);
    cpu_->add(f32(a), f32(b), o);
    store(o, out);
  }
  void write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache, const Tensor& slot_mapping) override {
    // Row copies by slot, in the cache's dtype (what the GPU kernel does); MLA form: K only.
    const bool mla = !cache.v.defined() || cache.v.numel() == 0;
    const int64_t t = k.size(0);
    const size_t k_row = cache.k.row_bytes() / static_cast<size_t>(cache.k.size(1));
    const size_t v_row = mla ? 0 : cache.v.row_bytes() / static_cast<size_t>(cache.v.size(1));
    const int64_t* slots = slot_mapping.data_as<int64_t>();
    for (int64_t i = 0; i < t; ++i) {
      if (slots[i] < 0) continue;
      std::memcpy(static_cast<char*>(cache.k.data()) + slots[i] * k_row, static_cast<const char*>(k.data()) + i * k_row,
                  k_row);
      if (mla) continue;
      std::memcpy(static_cast<char*>(cache.v.data()) + slots[i] * v_row, static_cast<const char*>(v.data()) + i * v_row,
                  v_row);
    }
  }
  void paged_attention(const Tensor& q, const KVCacheLayer& cache, const AttentionMetadata& md, float scale,
                       Tensor& out) override {
    const bool mla = !cache.v.defined() || cache.v.numel() == 0;
    KVCacheLayer c{f32(cache.k), mla ? Tensor() : f32(cache.v)};
    Tensor o = f32_like(out);
    cpu_->paged_attention(f32(q), c, md, scale, o);
    // Padding rows are left untouched: copy back only the rows that belong to sequences.
    const int64_t rows = md.num_seqs == 0 ? 0 : md.query_start_loc_host[md.num_seqs];
    Tensor o_rows = o.slice(0, rows), out_rows = out.slice(0, rows);
    store(o_rows, out_rows);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override { cpu_->gather_rows(x, indices, out); }

  // ---- MLA and MoE ----
  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override {
    cpu_->copy_columns(src, src_col, dst, dst_col, width);  // an exact element copy in any dtype
  }
  void head_linear(const Tensor& x, const Tensor& weight, Tensor& out) override {
    Tensor o = f32_like(out);
    cpu_->head_linear(f32(x), f32(weight), o);
    store(o, out);
  }
  void moe_route(const Tensor& router_logits, const Tensor* bias, const MoeRouting& params, Tensor& topk_ids,
                 Tensor& topk_weights) override {
    cpu_->moe_route(router_logits, bias, params, topk_ids, topk_weights);  // fp32 in and out, as on the GPU
  }
  void fused_moe(const Tensor& x, const Tensor& w13, const Tensor& w2, const Tensor& topk_ids,
                 const Tensor& topk_weights, Tensor& out) override {
    // Rounded where the CUDA kernels round (moe_reference.h).
    const int64_t t = x.size(0), h = x.size(1), e = w13.size(0), inter = w13.size(1) / 2, cols = topk_ids.size(1);
    std::vector<float> o = fused_moe_bf16_reference(f32(x).to_f32_vector(), f32(w13).to_f32_vector(),
                                                    f32(w2).to_f32_vector(), topk_ids.to_i32_vector(),
                                                    topk_weights.to_f32_vector(), t, h, inter, e, cols);
    store(Tensor::from_f32(o, out.shape()), out);
  }

 private:
  static Tensor f32(const Tensor& t) {
    if (t.dtype() == DType::kF32) return t;
    Tensor f = Tensor::empty(t.shape(), DType::kF32);
    convert_to_f32(t.data(), t.dtype(), f.data_as<float>(), static_cast<size_t>(t.numel()));
    return f;
  }
  static Tensor f32_like(const Tensor& t) { return Tensor::empty(t.shape(), DType::kF32); }
  // Rounds (round to nearest even) into dst's dtype.
  static void store(const Tensor& f, Tensor& dst) {
    convert_from_f32(f.data_as<float>(), dst.dtype(), dst.data(), static_cast<size_t>(f.numel()));
  }

  std::unique_ptr<Backend> cpu_;
};

}  // namespace specula::testing
