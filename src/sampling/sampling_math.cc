#include "sampling/sampling_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace specula {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void normalise(std::span<float> probs) {
  double sum = 0.0;
  for (float p : probs) sum += p;
  SPECULA_CHECK(sum > 0.0 && std::isfinite(sum), "sampling: the distribution has no mass left (sum {})", sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (float& p : probs) p *= inv;
}

// Keeps the most likely tokens while the mass of the tokens before them (in descending order) is
// below top_p: vLLM's "drop ascending-sorted tokens whose cumulative sum <= 1 - p". Only the head
// of the order is sorted, growing it until it covers p, since nearly all mass sits in few tokens.
void apply_top_p(std::span<float> probs, float top_p) {
  std::vector<int32_t> ids;
  ids.reserve(probs.size());
  for (size_t i = 0; i < probs.size(); ++i)
    if (probs[i] > 0.0f) ids.push_back(static_cast<int32_t>(i));
  auto more_likely = [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  size_t head = std::min<size_t>(64, ids.size());
  size_t keep = ids.size();
  while (true) {
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head), ids.end(), more_likely);
    double before = 0.0;
    size_t j = 0;
    for (; j < head && before < top_p; ++j) before += probs[ids[j]];
    if (before >= top_p || head == ids.size()) {
      keep = j;
      break;
    }
    head = std::min(ids.size(), head * 4);
  }
  for (size_t j = keep; j < ids.size(); ++j) probs[ids[j]] = 0.0f;
}

}  // namespace

int32_t argmax(std::span<const float> values) {
  SPECULA_ASSERT(!values.empty());
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<int32_t>(best);
}

void apply_penalties(std::span<float> logits, const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  for (const auto& [t, bias] : p.logit_bias)
    if (in_vocab(t)) logits[t] += bias;
  for (int32_t t : row.masked_token_ids)
    if (in_vocab(t)) logits[t] = kNegInf;
  if (!row.allowed_token_mask.empty()) {
    for (int64_t t = 0; t < vocab; ++t)
      if (!(row.allowed_token_mask[static_cast<size_t>(t >> 5)] >> (t & 31) & 1)) logits[t] = kNegInf;
  }

  if (p.repetition_penalty != 1.0f) {
    // Each token seen in prompt or output is penalised once: divided when positive, multiplied
    // when negative, so the penalty always makes it less likely.
    std::vector<int32_t> seen(row.prompt_token_ids.begin(), row.prompt_token_ids.end());
    seen.insert(seen.end(), row.output_token_ids.begin(), row.output_token_ids.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (!in_vocab(t)) continue;
      float& l = logits[t];
      l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int32_t> out(row.output_token_ids.begin(), row.output_token_ids.end());
    std::sort(out.begin(), out.end());
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      if (in_vocab(out[i]))
        logits[out[i]] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
}

void logits_to_probs(std::span<float> logits, const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  apply_penalties(logits, row);
  if (p.greedy()) {
    const int32_t best = argmax(logits);
    std::fill(logits.begin(), logits.end(), 0.0f);
    logits[best] = 1.0f;
    return;
  }
  const float max_logit = logits[argmax(logits)];
  SPECULA_CHECK(std::isfinite(max_logit), "sampling: every token is masked or the logits are not finite");
  const float inv_t = 1.0f / p.temperature;
  for (float& l : logits) l = std::exp((l - max_logit) * inv_t);
  normalise(logits);

  if (p.min_p > 0.0f) {
    const float threshold = p.min_p * logits[argmax(logits)];
    for (float& q : logits)
      if (q < threshold) q = 0.0f;
  }
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < logits.size()) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[p.top_k - 1];
    for (float& q : logits)
      if (q < kth) q = 0.0f;
  }
  if (p.top_p < 1.0f) {
    normalise(logits);
    apply_top_p(logits, p.top_p);
  }
  normalise(logits);
}

int32_t sample_from_probs(std::span<const float> probs, double u) {
  double total = 0.0;
  for (float q : probs) total += q;
  const double target = u * total;
  double cum = 0.0;
  int32_t last_nonzero = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    last_nonzero = static_cast<int32_t>(i);
    cum += probs[i];
    if (cum > target) return last_nonzero;
  }
  SPECULA_CHECK(last_nonzero >= 0, "sampling: the distribution is empty");
  return last_nonzero;  // rounding left target just above the total
}

PositionLogprobs compute_logprobs(std::span<const float> raw, int32_t target, int top_n) {
  SPECULA_CHECK(target >= 0 && static_cast<size_t>(target) < raw.size(), "logprobs: token {} outside the vocab of {}",
                target, raw.size());
  const float max_logit = raw[argmax(raw)];
  double sum = 0.0;
  for (float l : raw) sum += std::exp(static_cast<double>(l) - max_logit);
  const double lse = max_logit + std::log(sum);

  PositionLogprobs out;
  out.chosen.token_id = target;
  out.chosen.logprob = static_cast<float>(raw[target] - lse);
  int rank = 1;
  for (float l : raw) rank += l > raw[target] ? 1 : 0;
  out.chosen.rank = rank;

  if (top_n < 0 || top_n > static_cast<int>(raw.size())) top_n = static_cast<int>(raw.size());
  if (top_n > 0) {
    // A min-heap of the best top_n so far; "better" = larger logit, then lower id.
    auto better = [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); };
    std::vector<int32_t> heap;
    heap.reserve(static_cast<size_t>(top_n) + 1);
    for (int32_t i = 0; i < static_cast<int32_t>(raw.size()); ++i) {
      if (static_cast<int>(heap.size()) < top_n) {
        heap.push_back(i);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(i, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = i;
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
    std::sort(heap.begin(), heap.end(), better);
    for (size_t r = 0; r < heap.size(); ++r)
      out.top.push_back({heap[r], static_cast<float>(raw[heap[r]] - lse), static_cast<int>(r) + 1});
  }
  return out;
}

}  // namespace specula
