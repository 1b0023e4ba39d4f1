// Bounded load test of the serving daemon on loopback: N concurrent streaming clients (default
// 64) against an in-process server, every `--disconnect-every`-th of them hanging up after a few
// tokens. Checks that
//   - every client that stayed got status 200, a finish_reason and [DONE], and exactly the text
//     (and finish reason) of the same request served alone beforehand (distinct prompts and seeds,
//     so a lost, duplicated or mixed-up response cannot pass);
//   - every client that hung up had its generation cancelled (one cancelled sequence each, far
//     fewer tokens than it asked for);
//   - afterwards no KV block is in use and nothing is queued or running.
// Prints throughput and latency figures (client-side: time to first token from sending the
// request, per-token latency between streamed chunks). Exit status 0 when every check holds.
//
//   server_load --model M [--tokenizer T] [--clients 64] [--max-tokens 48] [--threads 1]
//               [--max-batch 16]
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/inference_server.h"
#include "server/sse_client.h"

namespace specinfer {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ClientSpec {
  json body;
  int disconnect_after = 0;  // > 0: hang up after this many events
};

struct ClientResult {
  int status = 0;
  std::string error;
  bool aborted = false;
  bool done = false;  // saw [DONE]
  std::string text;
  std::string finish;
  int content_events = 0;
  double ttft = -1;       // seconds from sending to the first text
  double per_token = -1;  // mean seconds between text chunks after the first
};

ClientResult ParseStream(const SseReply& r) {
  ClientResult c;
  c.status = r.status;
  c.error = r.error;
  c.aborted = r.aborted;
  double first = -1, last = -1;
  for (size_t i = 0; i < r.events.size(); ++i) {
    if (r.events[i] == "[DONE]") {
      c.done = true;
      continue;
    }
    json j = json::parse(r.events[i], nullptr, false);
    if (!j.is_object() || !j.contains("choices")) continue;
    for (const json& ch : j["choices"]) {
      const std::string piece = ch.value("text", "");
      if (!piece.empty()) {
        c.text += piece;
        ++c.content_events;
        if (first < 0) first = r.event_seconds[i];
        last = r.event_seconds[i];
      }
      if (ch.contains("finish_reason") && !ch["finish_reason"].is_null())
        c.finish = ch["finish_reason"];
    }
  }
  c.ttft = first;
  if (c.content_events > 1) c.per_token = (last - first) / (c.content_events - 1);
  return c;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double MetricValue(const std::string& text, const std::string& name) {
  const size_t p = text.find("\n" + name + " ");
  return p == std::string::npos ? 0 : std::stod(text.substr(p + name.size() + 2));
}

int Run(int argc, char** argv) {
  CLI::App app{"Load test of the serving daemon: concurrent streaming clients on loopback"};
  std::string model, tokenizer;
  int clients = 64, max_tokens = 48, threads = 1, disconnect_every = 4, max_batch = 16;
  app.add_option("-m,--model", model, "Model file")->required();
  app.add_option("--tokenizer", tokenizer, "Tokenizer file (llama2.c)");
  app.add_option("--clients", clients, "Concurrent streaming clients")->check(CLI::Range(1, 1024));
  app.add_option("--max-tokens", max_tokens, "Tokens per request (about)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "Engine threads")->check(CLI::Range(0, 256));
  app.add_option("--max-batch", max_batch, "Sequences run at once (continuous batching)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--disconnect-every", disconnect_every,
                 "Every k-th client hangs up early (0: none)")
      ->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  InferenceServerOptions o;
  o.engine.model_path = model;
  o.engine.tokenizer_path = tokenizer;
  o.engine.num_threads = threads;
  o.http.port = 0;
  o.enable_grpc = false;
  o.queue.max_queue = clients;
  o.queue.batch.max_sequences = max_batch;
  auto server_or = InferenceServer::Start(o);
  if (!server_or.ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  InferenceServer& server = **server_or;
  const int port = server.http_port();

  const std::vector<std::string> prompts = {
      "Once upon a time", "The little dog", "Lily and Tom went", "One day, a big bird",
      "The sun was",      "Mom said",       "There was a tiny",  "In the park"};
  std::vector<ClientSpec> specs(clients);
  int leavers = 0;
  for (int i = 0; i < clients; ++i) {
    json b = {{"prompt", prompts[i % prompts.size()]}, {"stream", true}};
    const bool leaves = disconnect_every > 0 && i % disconnect_every == disconnect_every - 1;
    if (leaves) {
      // Would run a long time if it were not cancelled.
      b["max_tokens"] = 400;
      b["ignore_eos"] = true;
      b["seed"] = 5000 + i;
      specs[i].disconnect_after = 3 + i % 5;
      ++leavers;
    } else {
      b["max_tokens"] = max_tokens / 2 + (i * 7) % (max_tokens / 2 + 1);
      b["temperature"] = i % 3 == 0 ? 0.0 : 0.8;
      b["seed"] = 1000 + i;
      if (i % 5 == 2) b["stop"] = json::array({"."});
    }
    specs[i].body = b;
  }

  // Each staying request alone first: the reference it must reproduce under load.
  std::vector<ClientResult> reference(clients);
  for (int i = 0; i < clients; ++i) {
    if (specs[i].disconnect_after) continue;
    reference[i] =
        ParseStream(PostSse("127.0.0.1", port, "/v1/completions", specs[i].body.dump()));
  }
  const std::string metrics_before = server.metrics().Render(server.queue().gauges());

  // All clients at once.
  std::vector<ClientResult> results(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int i = 0; i < clients; ++i) {
    pool.emplace_back([&, i] {
      ++ready;
      while (!go) std::this_thread::yield();
      results[i] = ParseStream(PostSse("127.0.0.1", port, "/v1/completions",
                                             specs[i].body.dump(), specs[i].disconnect_after));
    });
  }
  while (ready < clients) std::this_thread::yield();
  const auto t0 = Clock::now();
  go = true;
  for (std::thread& t : pool) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

  // Let the worker finish the cancellations, then look at what is left.
  for (int i = 0; i < 1000; ++i) {
    const ServingGauges g = server.queue().gauges();
    if (g.queued == 0 && g.running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ServingGauges g = server.queue().gauges();
  const std::string metrics_after = server.metrics().Render(g);

  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (++failures <= 20) std::printf("FAIL: %s\n", what.c_str());
  };
  int completed = 0, tokens = 0;
  std::vector<double> ttfts, per_token;
  for (int i = 0; i < clients; ++i) {
    const ClientResult& r = results[i];
    const std::string who = "client " + std::to_string(i);
    if (specs[i].disconnect_after) {
      if (!r.aborted) fail(who + " was meant to hang up but the stream ended first");
      continue;
    }
    const ClientResult& ref = reference[i];
    if (ref.status != 200 || !ref.done) fail(who + ": the reference run failed");
    if (r.status != 200) fail(who + ": status " + std::to_string(r.status) + " " + r.error);
    if (!r.done) fail(who + ": no [DONE]");
    if (r.finish.empty()) fail(who + ": no finish_reason");
    if (r.text != ref.text)
      fail(who + ": text differs from the request served alone:\n  alone: " + ref.text +
           "\n  load:  " + r.text);
    if (r.finish != ref.finish) fail(who + ": finish " + r.finish + " vs " + ref.finish);
    ++completed;
    tokens += r.content_events;
    if (r.ttft >= 0) ttfts.push_back(r.ttft);
    if (r.per_token >= 0) per_token.push_back(r.per_token);
  }
  const std::string cancelled = "specinfer_sequences_finished_total{reason=\"cancelled\"}";
  const double cancelled_now =
      MetricValue(metrics_after, cancelled) - MetricValue(metrics_before, cancelled);
  if (cancelled_now != leavers)
    fail(std::to_string(leavers) + " clients hung up but " + std::to_string(cancelled_now) +
         " sequences were cancelled");
  const double generated = MetricValue(metrics_after, "specinfer_generated_tokens_total") -
                           MetricValue(metrics_before, "specinfer_generated_tokens_total");
  if (g.kv_blocks_used != 0)
    fail(std::to_string(g.kv_blocks_used) + " KV blocks still in use after the load");
  if (g.queued != 0 || g.running != 0) fail("the queue did not drain");
  if (MetricValue(metrics_after, "specinfer_kv_blocks_used") != 0) fail("/metrics shows KV in use");

  std::printf("server_load: %d streaming clients (%d hung up early), %d completed\n", clients,
              leavers, completed);
  std::printf(
      "  wall %.2f s, %.1f requests/s, %.0f streamed tokens/s (%.0f generated incl. "
      "cancelled)\n",
      wall, completed / wall, tokens / wall, generated / wall);
  std::printf("  time to first token: median %.1f ms, p90 %.1f ms\n", Median(ttfts) * 1e3,
              Percentile(ttfts, 0.9) * 1e3);
  std::printf("  per-token latency: median %.2f ms (per request mean between chunks)\n",
              Median(per_token) * 1e3);
  std::printf("  after: KV blocks used %lld of %lld, queued %lld, running %lld\n",
              static_cast<long long>(g.kv_blocks_used), static_cast<long long>(g.kv_blocks_total),
              static_cast<long long>(g.queued), static_cast<long long>(g.running));
  std::printf("%s\n", failures == 0 ? "PASS" : "FAILED");
  server.Shutdown();
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) { return specinfer::Run(argc, argv); }
