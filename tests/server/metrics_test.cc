// Prometheus exposition of the server's figures.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <sstream>

namespace specinfer {
namespace {

bool HasLine(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

TEST(Histogram, RendersCumulativeBuckets) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.1);  // on the bound: le="0.1"
  h.Observe(0.5);
  h.Observe(7);
  std::string out;
  h.Render("x_seconds", "help text", &out);
  EXPECT_TRUE(HasLine(out, "# HELP x_seconds help text"));
  EXPECT_TRUE(HasLine(out, "# TYPE x_seconds histogram"));
  EXPECT_TRUE(HasLine(out, "x_seconds_bucket{le=\"0.1\"} 2"));
  EXPECT_TRUE(HasLine(out, "x_seconds_bucket{le=\"1\"} 3"));
  EXPECT_TRUE(HasLine(out, "x_seconds_bucket{le=\"+Inf\"} 4"));
  EXPECT_TRUE(HasLine(out, "x_seconds_sum 7.65"));
  EXPECT_TRUE(HasLine(out, "x_seconds_count 4"));
  EXPECT_EQ(h.count(), 4u);
}

TEST(ServerMetrics, RendersEveryFamily) {
  ServerMetrics m;
  m.CountRequest("/v1/completions", "200");
  m.CountRequest("/v1/completions", "200");
  m.CountRequest("/v1/completions", "400");
  m.ObserveTimeToFirstToken(0.02);
  m.ObserveInterTokenLatency(0.001);
  m.AddPromptTokens(5);
  m.AddGeneratedTokens(7);
  m.CountFinished("stop");
  ServingGauges g{3, 1, 10, 545, 2};
  g.kv_blocks_cached = 6;
  g.prefix_queried_tokens = 200;
  g.prefix_hit_tokens = 50;
  g.prefix_evictions = 4;
  g.spec_steps = 10;
  g.spec_speculating_steps = 7;
  g.spec_budget_tokens = 4;
  g.spec_budget_tokens_mean = 2.5;
  g.spec_predicted_gain = 1.5;
  g.spec_measured_gain = 1.25;
  const std::string out = m.Render(g);
  EXPECT_TRUE(HasLine(out, "specinfer_kv_blocks_cached 6"));
  EXPECT_TRUE(HasLine(out, "specinfer_prefix_cache_queried_tokens_total 200"));
  EXPECT_TRUE(HasLine(out, "specinfer_prefix_cache_hit_tokens_total 50"));
  EXPECT_TRUE(HasLine(out, "specinfer_prefix_cache_hit_rate 0.25"));
  EXPECT_TRUE(HasLine(out, "specinfer_prefix_cache_evictions_total 4"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_controller_steps_total{speculating=\"true\"} 7"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_controller_steps_total{speculating=\"false\"} 3"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_budget_tokens 4"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_budget_tokens_mean 2.5"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_predicted_gain 1.5"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_measured_gain 1.25"));
  EXPECT_TRUE(
      HasLine(out, "specinfer_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 2"));
  EXPECT_TRUE(
      HasLine(out, "specinfer_requests_total{endpoint=\"/v1/completions\",code=\"400\"} 1"));
  EXPECT_TRUE(HasLine(out, "specinfer_queue_length 3"));
  EXPECT_TRUE(HasLine(out, "specinfer_running_sequences 1"));
  EXPECT_TRUE(HasLine(out, "specinfer_kv_blocks_used 10"));
  EXPECT_TRUE(HasLine(out, "specinfer_kv_blocks_total 545"));
  EXPECT_TRUE(HasLine(out, "specinfer_draft_sessions 2"));
  EXPECT_TRUE(HasLine(out, "specinfer_prompt_tokens_total 5"));
  EXPECT_TRUE(HasLine(out, "specinfer_generated_tokens_total 7"));
  EXPECT_TRUE(HasLine(out, "specinfer_sequences_finished_total{reason=\"stop\"} 1"));
  EXPECT_TRUE(HasLine(out, "specinfer_time_to_first_token_seconds_count 1"));
  EXPECT_TRUE(HasLine(out, "specinfer_inter_token_latency_seconds_count 1"));
  // Speculation families exist (zero) before any speculation ran.
  EXPECT_TRUE(HasLine(out, "specinfer_spec_llm_passes_total 0"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_accepted_tokens_total 0"));
  EXPECT_TRUE(HasLine(out, "# TYPE specinfer_spec_accepted_tokens_by_depth_total counter"));
  EXPECT_EQ(m.requests("/v1/completions", "200"), 2);
  EXPECT_EQ(m.requests("/v1/completions", "503"), 0);

  // Every sample line is "name[{labels}] value" with a parseable value.
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#') continue;
    const size_t sp = l.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << l;
    size_t used = 0;
    std::stod(l.substr(sp + 1), &used);
    EXPECT_EQ(used, l.size() - sp - 1) << l;
  }
}

TEST(ServerMetrics, SpeculationCounters) {
  ServerMetrics m;
  SpeculationCounters s;
  s.llm_passes = 10;
  s.accepted_tokens = 17;
  s.accepted_by_depth = {9, 6, 2};
  s.accepted_by_speculator = {{"ngram:3", 12}, {"layers:4", 5}};
  m.AddSpeculation(s);
  m.AddSpeculation(s);
  const std::string out = m.Render({});
  EXPECT_TRUE(HasLine(out, "specinfer_spec_llm_passes_total 20"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_accepted_tokens_total 34"));
  EXPECT_TRUE(HasLine(out, "specinfer_spec_accepted_tokens_by_depth_total{depth=\"2\"} 12"));
  EXPECT_TRUE(HasLine(
      out, "specinfer_spec_accepted_tokens_by_speculator_total{speculator=\"ngram:3\"} 24"));
}

TEST(ServerMetrics, EscapesLabelValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace specinfer
