#include <gtest/gtest.h>

#include "server/metrics.h"

namespace specula::server {
namespace {

TEST(Metrics, Buckets125) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(4), (std::vector<double>{1, 2}));
}

TEST(Metrics, HistogramIsCumulativeWithInfAndCount) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7.0);
  std::string out;
  h.render(&out, "x", "a=\"b\"");
  EXPECT_EQ(out,
            "x_bucket{a=\"b\",le=\"0.1\"} 2.0\n"
            "x_bucket{a=\"b\",le=\"1.0\"} 3.0\n"
            "x_bucket{a=\"b\",le=\"+Inf\"} 4.0\n"
            "x_count{a=\"b\"} 4.0\n"
            "x_sum{a=\"b\"} 7.65\n");
}

TEST(Metrics, RequestPhasesAndIterationTokensAreVllmHistograms) {
  ServerMetrics m(1000);
  m.observe_request_phases(RequestTimes{10.0, 10.5, 11.0, 13.0});
  EngineMetrics e;
  e.iteration_tokens_buckets.assign(std::size(kIterationTokenBuckets) + 1, 0);
  e.iteration_tokens_buckets[0] = 2;  // two steps of 1 token
  e.iteration_tokens_buckets[2] = 3;  // three of 9..16
  e.iteration_tokens_sum = 2 + 3 * 12;
  const std::string text = m.render(e, "m");
  const std::string l = "engine=\"0\",model_name=\"m\"";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE vllm:request_queue_time_seconds histogram",
           "vllm:request_queue_time_seconds_sum{" + l + "} 0.5",
           "vllm:request_prefill_time_seconds_sum{" + l + "} 0.5",
           "vllm:request_decode_time_seconds_sum{" + l + "} 2.0",
           "vllm:request_inference_time_seconds_sum{" + l + "} 2.5",
           "vllm:request_inference_time_seconds_count{" + l + "} 1.0",
           "# TYPE vllm:iteration_tokens_total histogram",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"1.0\"} 2.0",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"8.0\"} 2.0",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"16.0\"} 5.0",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"+Inf\"} 5.0",
           "vllm:iteration_tokens_total_count{" + l + "} 5.0",
           "vllm:iteration_tokens_total_sum{" + l + "} 38.0"}) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\n" << text;
  }
}

TEST(Metrics, RendersVllmNamesWithModelLabel) {
  ServerMetrics m(1000);
  m.observe_ttft(0.02);
  m.observe_inter_token(0.03);
  m.observe_request_done(1.2, 10, 5);
  m.count_finished(FinishReason::kStop);
  m.count_finished(FinishReason::kLength);
  m.count_finished(FinishReason::kStop);
  EngineMetrics e;
  e.num_requests_running = 3;
  e.num_requests_waiting = 1;
  e.kv_cache_usage = 0.25;
  e.prompt_tokens_total = 100;
  e.generation_tokens_total = 40;
  e.prefix_cache_queries = 64;
  e.prefix_cache_hits = 32;
  e.num_preemptions = 2;
  e.spec_num_drafts = 4;
  e.spec_accepted_per_pos = {7, 3};
  e.num_gpu_blocks = 1024;
  e.block_size = 16;
  e.cache_dtype = "fp8";
  e.gpu_memory_utilization = 0.9;
  std::string text = m.render(e, "my \"model\"");
  const std::string labels = "{engine=\"0\",model_name=\"my \\\"model\\\"\"}";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE vllm:cache_config_info gauge",
           "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",enable_prefix_caching=\"True\",engine=\"0\","
           "gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"1024\"} 1.0",
           "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running" + labels + " 3.0",
           "vllm:num_requests_waiting" + labels + " 1.0", "vllm:kv_cache_usage_perc" + labels + " 0.25",
           "# TYPE vllm:prompt_tokens_total counter", "vllm:prompt_tokens_total" + labels + " 100.0",
           "vllm:generation_tokens_total" + labels + " 40.0", "vllm:prefix_cache_queries_total" + labels + " 64.0",
           "vllm:prefix_cache_hits_total" + labels + " 32.0", "vllm:num_preemptions_total" + labels + " 2.0",
           "vllm:spec_decode_num_drafts_total" + labels + " 4.0",
           "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"my \\\"model\\\"\",position=\"1\"} 3.0",
           "vllm:request_success_total{engine=\"0\",model_name=\"my \\\"model\\\"\",finished_reason=\"stop\"} 2.0",
           "vllm:request_success_total{engine=\"0\",model_name=\"my \\\"model\\\"\",finished_reason=\"length\"} 1.0",
           "vllm:request_success_total{engine=\"0\",model_name=\"my \\\"model\\\"\",finished_reason=\"abort\"} 0.0",
           "# TYPE vllm:time_to_first_token_seconds histogram", "vllm:time_to_first_token_seconds_count" + labels + " 1.0",
           "vllm:time_per_output_token_seconds_count" + labels + " 1.0",
           "vllm:inter_token_latency_seconds_count" + labels + " 1.0",
           "vllm:e2e_request_latency_seconds_sum" + labels + " 1.2",
           "vllm:request_prompt_tokens_sum" + labels + " 10.0",
           "vllm:request_generation_tokens_sum" + labels + " 5.0"}) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
  }
}

}  // namespace
}  // namespace specula::server
