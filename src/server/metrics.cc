#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace specinfer {

namespace {

std::string FormatDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Header(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Sample(std::string* out, std::string_view name, std::string_view labels, double value) {
  out->append(name);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  out->append(" ").append(FormatDouble(value)).append("\n");
}

// Latency buckets from 1 ms to 60 s (CPU decode steps of small models take ~1 ms; a first token
// behind a long queue can take tens of seconds).
std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60};
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void Histogram::Render(std::string_view name, std::string_view help, std::string* out) const {
  std::vector<uint64_t> counts;
  double sum;
  uint64_t count;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counts = counts_;
    sum = sum_;
    count = count_;
  }
  Header(out, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts[i];
    Sample(out, bucket, "le=\"" + FormatDouble(bounds_[i]) + "\"", static_cast<double>(cumulative));
  }
  Sample(out, bucket, "le=\"+Inf\"", static_cast<double>(count));
  Sample(out, std::string(name) + "_sum", "", sum);
  Sample(out, std::string(name) + "_count", "", static_cast<double>(count));
}

ServerMetrics::ServerMetrics() : ttft_(LatencyBuckets()), itl_(LatencyBuckets()) {}

void ServerMetrics::CountRequest(std::string_view endpoint, std::string_view code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{std::string(endpoint), std::string(code)}];
}

void ServerMetrics::CountFinished(std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[std::string(reason)];
}

void ServerMetrics::AddSpeculation(const SpeculationCounters& s) {
  std::lock_guard<std::mutex> lock(mu_);
  spec_passes_ += s.llm_passes;
  spec_accepted_ += s.accepted_tokens;
  spec_draft_seconds_ += s.draft_seconds;
  for (size_t d = 0; d < s.accepted_by_depth.size(); ++d)
    spec_by_depth_[static_cast<int64_t>(d) + 1] += s.accepted_by_depth[d];
  for (const auto& [name, n] : s.accepted_by_speculator) spec_by_speculator_[name] += n;
}

int64_t ServerMetrics::finished(std::string_view reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = finished_.find(std::string(reason));
  return it == finished_.end() ? 0 : it->second;
}

int64_t ServerMetrics::requests(std::string_view endpoint, std::string_view code) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find({std::string(endpoint), std::string(code)});
  return it == requests_.end() ? 0 : it->second;
}

std::string ServerMetrics::Render(const ServingGauges& g) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Header(&out, "specinfer_requests_total", "counter",
           "Requests answered, by endpoint and HTTP status (gRPC: status code name).");
    for (const auto& [key, n] : requests_) {
      Sample(&out, "specinfer_requests_total",
             "endpoint=\"" + EscapeLabelValue(key.first) + "\",code=\"" +
                 EscapeLabelValue(key.second) + "\"",
             static_cast<double>(n));
    }
    Header(&out, "specinfer_sequences_finished_total", "counter",
           "Generated sequences by finish reason (stop, length, cancelled, error).");
    for (const auto& [reason, n] : finished_)
      Sample(&out, "specinfer_sequences_finished_total",
             "reason=\"" + EscapeLabelValue(reason) + "\"", static_cast<double>(n));
    Header(&out, "specinfer_spec_llm_passes_total", "counter",
           "Speculative verification passes of the LLM.");
    Sample(&out, "specinfer_spec_llm_passes_total", "", static_cast<double>(spec_passes_));
    Header(&out, "specinfer_spec_accepted_tokens_total", "counter",
           "Speculated tokens accepted by the LLM (per pass: divide by llm_passes_total).");
    Sample(&out, "specinfer_spec_accepted_tokens_total", "", static_cast<double>(spec_accepted_));
    Header(&out, "specinfer_spec_draft_seconds_total", "counter",
           "Seconds the speculators spent drafting (per pass: divide by llm_passes_total).");
    Sample(&out, "specinfer_spec_draft_seconds_total", "", spec_draft_seconds_);
    Header(&out, "specinfer_spec_accepted_tokens_by_depth_total", "counter",
           "Accepted speculated tokens by token-tree depth.");
    for (const auto& [depth, n] : spec_by_depth_)
      Sample(&out, "specinfer_spec_accepted_tokens_by_depth_total",
             "depth=\"" + std::to_string(depth) + "\"", static_cast<double>(n));
    Header(&out, "specinfer_spec_accepted_tokens_by_speculator_total", "counter",
           "Accepted speculated tokens by the speculator that proposed them.");
    for (const auto& [name, n] : spec_by_speculator_)
      Sample(&out, "specinfer_spec_accepted_tokens_by_speculator_total",
             "speculator=\"" + EscapeLabelValue(name) + "\"", static_cast<double>(n));
  }
  Header(&out, "specinfer_queue_length", "gauge", "Sequences waiting for the engine.");
  Sample(&out, "specinfer_queue_length", "", static_cast<double>(g.queued));
  Header(&out, "specinfer_running_sequences", "gauge", "Sequences being generated.");
  Sample(&out, "specinfer_running_sequences", "", static_cast<double>(g.running));
  Header(&out, "specinfer_kv_blocks_used", "gauge", "Paged KV-cache blocks in use.");
  Sample(&out, "specinfer_kv_blocks_used", "", static_cast<double>(g.kv_blocks_used));
  Header(&out, "specinfer_kv_blocks_total", "gauge", "Paged KV-cache blocks in the pool.");
  Sample(&out, "specinfer_kv_blocks_total", "", static_cast<double>(g.kv_blocks_total));
  Header(&out, "specinfer_kv_blocks_cached", "gauge",
         "KV-cache blocks holding a cached prompt prefix (in use or evictable).");
  Sample(&out, "specinfer_kv_blocks_cached", "", static_cast<double>(g.kv_blocks_cached));
  Header(&out, "specinfer_prefix_cache_queried_tokens_total", "counter",
         "Prompt tokens looked up in the prefix cache.");
  Sample(&out, "specinfer_prefix_cache_queried_tokens_total", "",
         static_cast<double>(g.prefix_queried_tokens));
  Header(&out, "specinfer_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens whose KV entries were reused from the prefix cache.");
  Sample(&out, "specinfer_prefix_cache_hit_tokens_total", "",
         static_cast<double>(g.prefix_hit_tokens));
  Header(&out, "specinfer_prefix_cache_hit_rate", "gauge",
         "Prompt tokens reused from the prefix cache / prompt tokens looked up.");
  Sample(&out, "specinfer_prefix_cache_hit_rate", "",
         g.prefix_queried_tokens > 0
             ? static_cast<double>(g.prefix_hit_tokens) / g.prefix_queried_tokens
             : 0.0);
  Header(&out, "specinfer_prefix_cache_evictions_total", "counter",
         "Cached prefix blocks evicted (least recently used) for new KV entries.");
  Sample(&out, "specinfer_prefix_cache_evictions_total", "",
         static_cast<double>(g.prefix_evictions));
  Header(&out, "specinfer_draft_sessions", "gauge",
         "Draft sessions (one per sequence and speculator) alive in the process.");
  Sample(&out, "specinfer_draft_sessions", "", static_cast<double>(g.draft_sessions));
  Header(&out, "specinfer_spec_controller_steps_total", "counter",
         "Decode steps in which some sequence could speculate, by whether the adaptive "
         "controller let any do so.");
  Sample(&out, "specinfer_spec_controller_steps_total", "speculating=\"true\"",
         static_cast<double>(g.spec_speculating_steps));
  Sample(&out, "specinfer_spec_controller_steps_total", "speculating=\"false\"",
         static_cast<double>(g.spec_steps - g.spec_speculating_steps));
  Header(&out, "specinfer_spec_budget_tokens", "gauge",
         "Speculated tokens chosen for the last step (the shapes' nodes down to the chosen "
         "depths, or the node budgets of dynamic trees).");
  Sample(&out, "specinfer_spec_budget_tokens", "", static_cast<double>(g.spec_budget_tokens));
  Header(&out, "specinfer_spec_budget_tokens_mean", "gauge",
         "Speculated tokens chosen per step (EWMA).");
  Sample(&out, "specinfer_spec_budget_tokens_mean", "", g.spec_budget_tokens_mean);
  Header(&out, "specinfer_spec_predicted_gain", "gauge",
         "Predicted tokens/s over plain decoding's, per step (EWMA).");
  Sample(&out, "specinfer_spec_predicted_gain", "", g.spec_predicted_gain);
  Header(&out, "specinfer_spec_measured_gain", "gauge",
         "Measured tokens/s over plain decoding's predicted, per step (EWMA).");
  Sample(&out, "specinfer_spec_measured_gain", "", g.spec_measured_gain);
  Header(&out, "specinfer_prompt_tokens_total", "counter", "Prompt tokens processed.");
  Sample(&out, "specinfer_prompt_tokens_total", "", static_cast<double>(prompt_tokens_.load()));
  Header(&out, "specinfer_generated_tokens_total", "counter", "Tokens generated.");
  Sample(&out, "specinfer_generated_tokens_total", "",
         static_cast<double>(generated_tokens_.load()));
  ttft_.Render("specinfer_time_to_first_token_seconds",
               "Seconds from a request's arrival to its first generated token.", &out);
  itl_.Render("specinfer_inter_token_latency_seconds",
              "Seconds between consecutive generated tokens of a sequence.", &out);
  return out;
}

}  // namespace specinfer
