// Host cost of the adaptive depth's per-step decision (AdaptiveDepth::choose, and feeds_proposer
// as an MTP / EAGLE step asks it too) with a cost model measured at every key a concurrency-1
// run uses. It runs once per engine step on the host, beside a ~160 us step of the embedded
// target on the H200: it should stay well under a microsecond.
#include <benchmark/benchmark.h>

#include <memory>

#include "spec_decode/adaptive_depth.h"
#include "spec_decode/step_cost_model.h"

namespace specula {
namespace {

AdaptiveDepth measured_depth(int k) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = k;
  auto cost = std::make_unique<OnlineCostModel>(k + 1, 0.2, 0.2, 3.0);
  for (int r = 1; r <= k + 1; ++r) cost->record_target(1, r, 160e-6 + r * 1e-6);
  for (int d = 1; d <= k; ++d) cost->record_draft(1, d, 138e-6 + 25e-6 * d);
  cost->record_host(1, 24e-6);
  AdaptiveDepth depth(c, std::move(cost));
  for (int i = 0; i < 100; ++i) depth.record_verification(k, k / 2);
  return depth;
}

void BM_ChooseDepth(benchmark::State& state) {
  AdaptiveDepth depth = measured_depth(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(depth.choose(1));
    benchmark::DoNotOptimize(depth.feeds_proposer(1));
  }
}
BENCHMARK(BM_ChooseDepth)->Arg(5)->Arg(10);

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();
