// CPU backend: rotary position embedding, in place on q and k.
//
// Row p of cos_sin holds cos(p * inv_freq[i]) for i < rotary_dim/2, then sin(p * inv_freq[i]).
// Each pair (a, b) of a head's first rotary_dim dims, with frequency i, becomes
//   a' = a * cos_i - b * sin_i,   b' = b * cos_i + a * sin_i
// neox:        a = x[i], b = x[i + rotary_dim/2]   (HF's q * cos + rotate_half(q) * sin)
// interleaved: a = x[2i], b = x[2i + 1]            (GPT-J / DeepSeek rope_interleave)
// Dims past rotary_dim are left as they are (partial rotary).
#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

void rotate_heads(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin, int rotary_dim,
                  bool neox) {
  const int half = rotary_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* head = x + h * head_dim;
    for (int i = 0; i < half; ++i) {
      float* pa = neox ? head + i : head + 2 * i;
      float* pb = neox ? head + i + half : head + 2 * i + 1;
      const float a = *pa, b = *pb;
      *pa = a * cos[i] - b * sin[i];
      *pb = b * cos[i] + a * sin[i];
    }
  }
}

}  // namespace

void CpuBackend::rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& cos_sin, int rotary_dim,
                      bool neox) {
  cpu_check::f32(q, "rope", "q");
  cpu_check::f32(k, "rope", "k");
  cpu_check::f32(cos_sin, "rope", "cos_sin");
  cpu_check::index_vector(positions, DType::kI32, "rope", "positions");
  SPECULA_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
                "rope: q {} and k {} must be [T, Hq, D] and [T, Hk, D]", q.describe(), k.describe());
  const int64_t t = q.size(0), hq = q.size(1), hk = k.size(1), d = q.size(2);
  SPECULA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= d,
                "rope: rotary_dim {} must be even and in (0, head_dim = {}]", rotary_dim, d);
  SPECULA_CHECK(cos_sin.ndim() == 2 && cos_sin.size(1) == rotary_dim,
                "rope: cos_sin {} must be [max_positions, rotary_dim = {}]", cos_sin.describe(), rotary_dim);
  SPECULA_CHECK(positions.size(0) >= t, "rope: positions {} has fewer than the {} rows of q", positions.describe(),
                t);
  const int64_t max_pos = cos_sin.size(0);
  const int32_t* pos = positions.data_as<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    SPECULA_CHECK(pos[i] >= 0 && pos[i] < max_pos, "rope: position {} at row {} is outside the cos/sin table [0, {})",
                  pos[i], i, max_pos);
  }
  float* qp = q.data_as<float>();
  float* kp = k.data_as<float>();
  const float* table = cos_sin.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (t * (hq + hk) * rotary_dim > 16384)
  for (int64_t i = 0; i < t; ++i) {
    const float* cos = table + static_cast<int64_t>(pos[i]) * rotary_dim;
    const float* sin = cos + rotary_dim / 2;
    rotate_heads(qp + i * hq * d, hq, d, cos, sin, rotary_dim, neox);
    rotate_heads(kp + i * hk * d, hk, d, cos, sin, rotary_dim, neox);
  }
}

}  // namespace specula
