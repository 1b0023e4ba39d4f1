// The server's figures, exposed at GET /metrics in Prometheus text format (version 0.0.4).
//
//   specinfer_requests_total{endpoint,code}        counter  requests answered, by HTTP status
//                                                           (or gRPC code name for RPCs)
//   specinfer_queue_length                         gauge    sequences waiting for the engine
//   specinfer_running_sequences                    gauge    sequences being generated
//   specinfer_kv_blocks_used / _total              gauge    paged KV-cache blocks
//   specinfer_kv_blocks_cached                     gauge    blocks holding a cached prefix
//   specinfer_prefix_cache_queried_tokens_total    counter  prompt tokens looked up in the
//                                                           prefix cache (kv/kv_cache.h)
//   specinfer_prefix_cache_hit_tokens_total        counter  of which reused from it
//   specinfer_prefix_cache_hit_rate                gauge    hit / queried tokens (0 if none)
//   specinfer_prefix_cache_evictions_total         counter  cached blocks reused for new data
//   specinfer_draft_sessions                       gauge    speculators' per-sequence sessions
//                                                           alive in the process (0 when idle)
//   specinfer_time_to_first_token_seconds          histogram  request arrival -> first token
//   specinfer_inter_token_latency_seconds          histogram  between consecutive tokens
//   specinfer_prompt_tokens_total                  counter
//   specinfer_generated_tokens_total               counter
//   specinfer_sequences_finished_total{reason}     counter  stop, length, cancelled, error
//   specinfer_spec_llm_passes_total                counter  verification passes of the LLM
//   specinfer_spec_accepted_tokens_total           counter  speculated tokens the LLM accepted
//   specinfer_spec_draft_seconds_total             counter  speculators drafting (a batched
//                                                           draft's time split among its sequences)
//   specinfer_spec_accepted_tokens_by_depth_total{depth}          counter
//   specinfer_spec_accepted_tokens_by_speculator_total{speculator} counter
//   specinfer_spec_controller_steps_total{speculating}             counter  decode steps that
//                                                           could speculate, by whether any did
//   specinfer_spec_budget_tokens / _mean           gauge    speculated tokens the adaptive
//                                                           controller chose (last step / EWMA):
//                                                           shape nodes to the chosen depths, or
//                                                           dynamic trees' node budgets
//   specinfer_spec_predicted_gain / measured_gain  gauge    EWMA per step of tok/s over plain
//                                                           decoding's (predicted; measured)
// Accepted tokens per pass = accepted_tokens_total / llm_passes_total. The specinfer_spec_*
// families are filled through AddSpeculation by the speculative generator; they stay 0 until it
// is wired in.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specinfer {

// A Prometheus histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  uint64_t count() const;
  // Appends the family (HELP, TYPE, cumulative _bucket lines, _sum, _count) to *out.
  void Render(std::string_view name, std::string_view help, std::string* out) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Instantaneous state of the request queue and the engine core, read when /metrics is rendered.
struct ServingGauges {
  int64_t queued = 0;
  int64_t running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t draft_sessions = 0;  // DraftSession::live() (spec/speculator.h)
  // The prefix cache (KvCacheManager::prefix_stats): blocks now, cumulative tokens and evictions.
  int64_t kv_blocks_cached = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_evictions = 0;
  // The adaptive speculation controller (engine/spec_controller.h SpecControllerSnapshot).
  int64_t spec_steps = 0;
  int64_t spec_speculating_steps = 0;
  int64_t spec_budget_tokens = 0;
  double spec_budget_tokens_mean = 0;
  double spec_predicted_gain = 1;
  double spec_measured_gain = 1;
};

// What one or more speculative verification passes contributed: for a finished request, its
// GenerateStats' decode_passes, spec.accepted_tokens, spec.accepted_at_depth and
// spec.speculator_names / spec.accepted_by.
struct SpeculationCounters {
  int64_t llm_passes = 0;
  int64_t accepted_tokens = 0;
  double draft_seconds = 0;  // spec.draft_seconds
  std::vector<int64_t> accepted_by_depth;  // index d - 1: accepted at tree depth d (root = 0)
  std::vector<std::pair<std::string, int64_t>> accepted_by_speculator;  // ("ngram:3", n)
};

class ServerMetrics {
 public:
  ServerMetrics();

  void CountRequest(std::string_view endpoint, std::string_view code);
  void ObserveTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
  void ObserveInterTokenLatency(double seconds) { itl_.Observe(seconds); }
  void AddPromptTokens(int64_t n) { prompt_tokens_ += n; }
  void AddGeneratedTokens(int64_t n) { generated_tokens_ += n; }
  // reason: "stop", "length", "cancelled" or "error".
  void CountFinished(std::string_view reason);
  void AddSpeculation(const SpeculationCounters& stats);

  // Requests answered so far for (endpoint, code); 0 if none (for tests).
  int64_t requests(std::string_view endpoint, std::string_view code) const;
  // Sequences finished so far with `reason`; 0 if none (for tests).
  int64_t finished(std::string_view reason) const;
  uint64_t ttft_count() const { return ttft_.count(); }

  // The whole exposition, gauges from `gauges`.
  std::string Render(const ServingGauges& gauges) const;

 private:
  Histogram ttft_;
  Histogram itl_;
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generated_tokens_{0};
  mutable std::mutex mu_;  // guards the labelled counters below
  std::map<std::pair<std::string, std::string>, int64_t> requests_;
  std::map<std::string, int64_t> finished_;
  int64_t spec_passes_ = 0;
  double spec_draft_seconds_ = 0;
  int64_t spec_accepted_ = 0;
  std::map<int64_t, int64_t> spec_by_depth_;
  std::map<std::string, int64_t> spec_by_speculator_;
};

// `value` escaped for a Prometheus label value (backslash, double quote, newline).
std::string EscapeLabelValue(std::string_view value);

}  // namespace specinfer
