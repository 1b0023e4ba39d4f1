// Serving load benchmark: an in-process daemon (the real HTTP gateway, request queue and engine
// core) and C concurrent streaming clients on loopback, for each concurrency in --concurrency
// and with speculation off and on, all in one run. Prints per setting: requests/s, generated
// tokens/s, and the median / p90 / p99 of time to first token (TTFT: request sent -> first text)
// and time per output token (TPOT: (last - first token time) / (tokens - 1), per request).
// Requests are greedy, so every request's text must be the same with speculation on and off; the
// program checks that and exits 1 if not. With --temperature T > 0 (and --top-p P) they are
// sampled instead, each with its own seed: speculation keeps the distribution, not the text, so
// texts are not compared. Each concurrency starts with one unmeasured run (it
// fills the prefix cache with the prompts, as every later run finds it). With --repeat R it then
// runs R pairs, off-on, on-off, off-on, ... (the order alternates, so a drift of the machine's
// speed does not favour either side) and reports the median on/off tok/s ratio of the R pairs;
// after each "on" run it reads the adaptive controller's figures from /metrics (chosen
// speculated tokens per step, predicted and measured gain; engine/spec_controller.h). --json
// FILE writes every run.
//
//   bench_serving --model M [--tokenizer T] [--threads 2] [--concurrency 1,8,32]
//                 [--requests 32] [--max-tokens 64] [--draft ngram] [--tree 1,1,1,1]
//                 [--workload edit|open] [--chat-template chatml] [--repeat 1]
//                 [--spec-budget auto|static|dynamic] [--batch-drafts on|off] [--json FILE]
//                 [--temperature 0] [--top-p 1]
//   bench_serving --cluster CONFIG [--model M [--tokenizer T]] [--specinfer PATH] ...
//   bench_serving --model M --workload chat-multiturn [--conversations 16] [--turns 8]
//                 [--max-tokens 24] [--rounds 2] [--json]
//
// The chat-multiturn workload measures automatic prefix caching (kv/kv_cache.h): C concurrent
// conversations (--conversations) of T turns each (--turns) share one system prompt; each turn
// sends the whole conversation so far (system, earlier questions and the answers streamed back)
// plus the next question. It runs with the daemon's prefix cache on and off alternately
// (--rounds pairs, on-off then off-on, a fresh daemon per run so nothing is cached across runs),
// and prints per run requests/s, generated tokens/s, TTFT p50/p90/p99 (all turns, and turns 2+
// alone) and the prefix-cache hit rate (prompt tokens reused / prompt tokens looked up, from the
// daemon's counters; not available with --cluster). Greedy: every answer must be the same with
// the cache on and off; the program checks that and exits 1 if not. --json prints the runs and
// the medians as one JSON object instead of the table.
//
// With --cluster the daemon is a distributed deployment started from a cluster config
// (`specinfer cluster --config CONFIG --any-ports --http-port 0 [--model M]`, the binary beside
// this one unless --specinfer says otherwise), stopped with SIGTERM at the end; the
// speculation-on runs then use the deployment's own speculators (its SSM workers) unless --draft
// is given.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <fstream>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/inference_server.h"
#include "server/sse_client.h"

namespace specinfer {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Prompts of the two workloads: "edit" repeats its input (prompt lookup guesses well), "open"
// is free writing (guesses rarely hit).
const std::vector<std::string> kEditTexts = {
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "Our meeting is moved to Thursday at ten in the small room on the second floor.",
    "Please bring the signed forms, your badge and a laptop charger to the training.",
    "The library opens at nine, closes at six, and is shut on public holidays.",
    "Water the tomatoes every morning, and pick the ripe ones before the weekend.",
    "The train to the coast leaves from platform four and stops at every station.",
    "Remember to back up the database before upgrading the server on Friday night.",
    "The recipe needs two eggs, a cup of flour, some milk and a pinch of salt."};
const std::vector<std::string> kOpenTexts = {
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue to a ten-year-old.",
    "Describe your ideal weekend in a few sentences.",
    "Give three tips for learning a new language.",
    "What makes a good cup of coffee?",
    "Tell me about the ocean.",
    "Invent a new holiday and describe how people celebrate it.",
    "Why do cats purr?"};

// The chat-multiturn workload: a system prompt every conversation shares, and the user's turns.
const char* kChatSystem =
    "You are a helpful assistant for a small town library. You answer questions about opening "
    "hours, borrowing rules, events and the reading rooms. Keep answers short and friendly. The "
    "library opens at nine and closes at six on weekdays, opens at ten and closes at four on "
    "Saturdays, and is closed on Sundays and public holidays. Members may borrow up to eight "
    "books for three weeks and renew them twice unless someone else has reserved them.";
const std::vector<std::string> kChatTurns = {
    "Hello! When are you open on Saturday?", "How many books can I borrow?",
    "Can I renew a book that someone reserved?", "Do you have a quiet room for studying?",
    "Are there any events for children this month?", "What happens if I return a book late?",
    "Can I print documents at the library?", "Thank you. What is your phone number?",
    "Do you lend e-books too?", "Is there parking nearby?"};

struct Sample {
  bool ok = false;
  std::string text;
  int tokens = 0;
  double ttft = 0, tpot = 0, seconds = 0;
};

Sample RunOne(int port, const json& body) {
  Sample s;
  const auto t0 = Clock::now();
  SseReply r = PostSse("127.0.0.1", port, "/v1/chat/completions", body.dump());
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (r.status != 200) {
    std::fprintf(stderr, "request failed: %d %s %s\n", r.status, r.error.c_str(), r.body.c_str());
    return s;
  }
  double first = -1, last = -1;
  for (size_t i = 0; i < r.events.size(); ++i) {
    if (r.events[i] == "[DONE]") continue;
    json j = json::parse(r.events[i], nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("usage") && j["usage"].is_object())
      s.tokens = j["usage"]["completion_tokens"].get<int>();
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const json& delta = j["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string() &&
        !delta["content"].get<std::string>().empty()) {
      s.text += delta["content"].get<std::string>();
      if (first < 0) first = r.event_seconds[i];
      last = r.event_seconds[i];
    }
  }
  s.ok = first >= 0 && s.tokens > 0;
  s.ttft = first;
  s.tpot = s.tokens > 1 ? (last - first) / (s.tokens - 1) : 0;
  return s;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

struct BenchSettings {
  std::vector<int> concurrency;
  int requests = 32, max_tokens = 64, repeat = 1;
  std::string draft, tree, workload, json_path;
  float temperature = 0.0f, top_p = 1.0f;  // sampled requests where temperature > 0
};
int RunBenchmark(int port, const std::string& what, const BenchSettings& b);

// The value of the unlabelled sample `name` in a Prometheus exposition; -1 if absent.
double MetricValue(const std::string& text, const std::string& name) {
  for (size_t p = text.find("\n" + name + " "); p != std::string::npos;
       p = text.find("\n" + name + " ", p + 1)) {
    return std::atof(text.c_str() + p + name.size() + 2);
  }
  return -1;
}
double MetricLabelled(const std::string& text, const std::string& sample) {
  const size_t p = text.find("\n" + sample + " ");
  return p == std::string::npos ? -1 : std::atof(text.c_str() + p + sample.size() + 2);
}

std::string ScrapeMetrics(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10, 0);
  auto r = cli.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

// One run of the chat-multiturn workload against the daemon at `port`.
struct ChatRun {
  bool prefix_cache = false;
  double wall = 0;
  int requests = 0;
  int64_t tokens = 0;
  std::vector<double> ttft_ms, later_ttft_ms;  // all turns; turns 2+
  std::vector<std::string> answers;            // [conversation * turns + turn]
  double hit_rate = -1;                        // -1: not known (the daemon's /metrics lacked it)
  int64_t evictions = -1, cached_blocks = -1;
  bool failed = false;
};

// The run's prefix-cache figures from the daemon's /metrics before and after it (a cluster's
// manager): hit rate = hit / queried prompt tokens over the run, evictions over the run, cached
// blocks at its end. Left at -1 when a scrape failed or lacks the counters.
void PrefixCacheFromMetrics(const std::string& before, const std::string& after, ChatRun* run) {
  const double q0 = MetricValue(before, "specinfer_prefix_cache_queried_tokens_total");
  const double q1 = MetricValue(after, "specinfer_prefix_cache_queried_tokens_total");
  const double h0 = MetricValue(before, "specinfer_prefix_cache_hit_tokens_total");
  const double h1 = MetricValue(after, "specinfer_prefix_cache_hit_tokens_total");
  if (q0 < 0 || q1 < 0 || h0 < 0 || h1 < 0) return;
  run->hit_rate = q1 > q0 ? (h1 - h0) / (q1 - q0) : 0;
  const double e0 = MetricValue(before, "specinfer_prefix_cache_evictions_total");
  const double e1 = MetricValue(after, "specinfer_prefix_cache_evictions_total");
  if (e0 >= 0 && e1 >= 0) run->evictions = static_cast<int64_t>(e1 - e0);
  const double cached = MetricValue(after, "specinfer_kv_blocks_cached");
  if (cached >= 0) run->cached_blocks = static_cast<int64_t>(cached);
}

ChatRun RunChat(int port, int conversations, int turns, int max_tokens) {
  ChatRun run;
  run.answers.assign(static_cast<size_t>(conversations) * turns, "");
  std::vector<std::vector<double>> ttft(conversations), later(conversations);
  std::vector<int64_t> tokens(conversations, 0);
  std::atomic<bool> failed{false};
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < conversations; ++c) {
    clients.emplace_back([&, c] {
      json messages = json::array({{{"role", "system"}, {"content", kChatSystem}}});
      for (int t = 0; t < turns && !failed; ++t) {
        messages.push_back(
            {{"role", "user"}, {"content", kChatTurns[(c + t) % kChatTurns.size()]}});
        json b = {{"messages", messages},
                  {"max_tokens", max_tokens},
                  {"temperature", 0},
                  {"stream", true},
                  {"stream_options", {{"include_usage", true}}}};
        Sample s = RunOne(port, b);
        if (!s.ok) {
          failed = true;
          return;
        }
        ttft[c].push_back(s.ttft * 1e3);
        if (t > 0) later[c].push_back(s.ttft * 1e3);
        tokens[c] += s.tokens;
        run.answers[static_cast<size_t>(c) * turns + t] = s.text;
        messages.push_back({{"role", "assistant"}, {"content", s.text}});
      }
    });
  }
  for (std::thread& t : clients) t.join();
  run.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  run.failed = failed;
  for (int c = 0; c < conversations; ++c) {
    run.ttft_ms.insert(run.ttft_ms.end(), ttft[c].begin(), ttft[c].end());
    run.later_ttft_ms.insert(run.later_ttft_ms.end(), later[c].begin(), later[c].end());
    run.tokens += tokens[c];
    run.requests += static_cast<int>(ttft[c].size());
  }
  return run;
}

// A `specinfer cluster` child process; its HTTP port from its "listening http=" line.
struct ClusterChild {
  pid_t pid = -1;
  int port = 0;
};

ClusterChild StartCluster(const std::vector<std::string>& args) {
  ClusterChild c;
  int fds[2];
  if (pipe(fds) != 0) return c;
  c.pid = fork();
  if (c.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(args[0].c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  char line[4096];
  while (out && std::fgets(line, sizeof line, out)) {
    std::fputs(line, stderr);
    const char* http = std::strstr(line, "listening http=");
    if (http) {
      const char* colon = std::strchr(http + 15, ':');
      if (colon) c.port = std::atoi(colon + 1);
      break;
    }
  }
  // The child writes nothing more on its standard output; keep the pipe open until it exits.
  return c;
}

std::string SpecinferBeside(const std::string& given) {
  if (!given.empty()) return given;
  std::error_code ec;
  return (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "specinfer")
      .string();
}

// Runs chat-multiturn with the prefix cache on and off alternately, a fresh daemon per run.
int RunChatBenchmark(const std::string& model, const std::string& tokenizer,
                     const std::string& chat_template, int threads, const std::string& cluster,
                     const std::string& specinfer_bin, int conversations, int turns,
                     int max_tokens, int rounds, const std::string& json_path) {
  std::vector<ChatRun> runs;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool on = (r % 2 == 0) == (k == 0);  // on-off, then off-on
      ChatRun run;
      if (!cluster.empty()) {
        std::vector<std::string> args = {SpecinferBeside(specinfer_bin), "cluster", "--config",
                                         cluster, "--any-ports", "--http-port", "0"};
        if (!model.empty()) {
          args.insert(args.end(), {"--model", model});
          if (!tokenizer.empty()) args.insert(args.end(), {"--tokenizer", tokenizer});
        }
        if (!chat_template.empty()) args.insert(args.end(), {"--chat-template", chat_template});
        if (!on) args.push_back("--no-prefix-cache");
        ClusterChild child = StartCluster(args);
        if (child.port == 0) {
          std::fprintf(stderr, "error: the cluster did not start\n");
          if (child.pid > 0) {
            kill(child.pid, SIGKILL);
            waitpid(child.pid, nullptr, 0);
          }
          return 1;
        }
        RunOne(child.port, {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                            {"max_tokens", 4}, {"stream", true}});  // warm-up
        // The manager runs the engine core and its KV cache: its /metrics counts the prefix
        // cache as the in-process daemon's gauges do.
        const std::string before = ScrapeMetrics(child.port);
        run = RunChat(child.port, conversations, turns, max_tokens);
        const std::string after = ScrapeMetrics(child.port);
        PrefixCacheFromMetrics(before, after, &run);
        kill(child.pid, SIGTERM);
        waitpid(child.pid, nullptr, 0);
      } else {
        InferenceServerOptions o;
        o.engine.model_path = model;
        o.engine.tokenizer_path = tokenizer;
        o.engine.num_threads = threads;
        o.engine.context_length = 2048;  // KV for `conversations` sequences stays small
        o.chat_template = chat_template;
        o.queue.batch.max_sequences = conversations;
        o.queue.batch.prefix_cache = on;
        o.queue.max_queue = std::max(64, 2 * conversations);
        o.http.port = 0;
        o.http.threads = conversations + 8;
        o.enable_grpc = false;
        auto server_or = InferenceServer::Start(std::move(o));
        if (!server_or.ok()) {
          std::fprintf(stderr, "error: %s\n", server_or.status().ToString().c_str());
          return 1;
        }
        std::unique_ptr<InferenceServer> server = std::move(server_or).value();
        RunOne(server->http_port(), {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                     {"max_tokens", 4}, {"stream", true}});  // warm-up
        const ServingGauges before = server->queue().gauges();
        run = RunChat(server->http_port(), conversations, turns, max_tokens);
        const ServingGauges after = server->queue().gauges();
        const int64_t queried = after.prefix_queried_tokens - before.prefix_queried_tokens;
        run.hit_rate = queried > 0 ? static_cast<double>(after.prefix_hit_tokens -
                                                         before.prefix_hit_tokens) / queried
                                   : 0;
        run.evictions = after.prefix_evictions - before.prefix_evictions;
        run.cached_blocks = after.kv_blocks_cached;
        server->Shutdown();
      }
      run.prefix_cache = on;
      std::fprintf(stderr, "run %zu: prefix cache %s, %d requests in %.1f s, %.1f tok/s, TTFT "
                   "p50 %.0f ms, hit rate %.3f\n", runs.size() + 1, on ? "on" : "off",
                   run.requests, run.wall, run.tokens / run.wall, Percentile(run.ttft_ms, 0.5),
                   run.hit_rate);
      runs.push_back(std::move(run));
    }
  }

  // Same answers with the cache on and off (greedy), run for run.
  bool failed = false, mismatch = false;
  const ChatRun* first_off = nullptr;
  for (const ChatRun& r : runs) {
    failed |= r.failed;
    if (!r.prefix_cache && !first_off) first_off = &r;
  }
  for (const ChatRun& r : runs)
    if (first_off && !r.failed && !first_off->failed && r.answers != first_off->answers)
      mismatch = true;

  auto row = [&](const ChatRun& r) {
    return json{{"prefix_cache", r.prefix_cache},
                {"requests", r.requests},
                {"seconds", r.wall},
                {"requests_per_second", r.requests / r.wall},
                {"generated_tokens_per_second", r.tokens / r.wall},
                {"ttft_ms_p50", Percentile(r.ttft_ms, 0.5)},
                {"ttft_ms_p90", Percentile(r.ttft_ms, 0.9)},
                {"ttft_ms_p99", Percentile(r.ttft_ms, 0.99)},
                {"later_turns_ttft_ms_p50", Percentile(r.later_ttft_ms, 0.5)},
                {"later_turns_ttft_ms_p90", Percentile(r.later_ttft_ms, 0.9)},
                {"prefix_cache_hit_rate", r.hit_rate},
                {"prefix_cache_evictions", r.evictions},
                {"kv_blocks_cached", r.cached_blocks}};
  };
  // Medians over the runs of each setting, and on / off ratios of them.
  auto median_of = [&](bool on, const char* key) {
    std::vector<double> v;
    for (const ChatRun& r : runs)
      if (r.prefix_cache == on) v.push_back(row(r)[key].get<double>());
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
  };
  const char* keys[] = {"requests_per_second", "generated_tokens_per_second", "ttft_ms_p50",
                        "ttft_ms_p90", "later_turns_ttft_ms_p50", "prefix_cache_hit_rate"};
  json summary;
  for (bool on : {true, false})
    for (const char* k : keys) summary[on ? "on" : "off"][k] = median_of(on, k);
  for (const char* k : keys)
    if (median_of(false, k) > 0)
      summary["on_over_off"][k] = median_of(true, k) / median_of(false, k);

  const std::string what =
      cluster.empty() ? "model " + model + ", " + std::to_string(threads) + " threads"
                      : "cluster " + cluster;
  if (!json_path.empty()) {
    json out = {{"workload", "chat-multiturn"},
                {"target", what},
                {"conversations", conversations},
                {"turns", turns},
                {"max_tokens", max_tokens},
                {"runs", json::array()},
                {"median", summary},
                {"same_outputs", !mismatch},
                {"failed", failed}};
    for (const ChatRun& r : runs) out["runs"].push_back(row(r));
    if (json_path == "-") {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::ofstream(json_path) << out.dump(2) << "\n";
    }
  }
  if (json_path != "-") {
    std::printf("%s, workload chat-multiturn: %d conversations x %d turns, %d tokens per answer\n",
                what.c_str(), conversations, turns, max_tokens);
    std::printf("%-4s %-6s %8s %9s %9s %9s %9s %11s %9s %9s\n", "run", "cache", "req/s", "tok/s",
                "TTFT p50", "p90", "p99", "turn2+ p50", "hit rate", "evicted");
    for (size_t i = 0; i < runs.size(); ++i) {
      const ChatRun& r = runs[i];
      std::printf("%-4zu %-6s %8.2f %9.1f %9.1f %9.1f %9.1f %11.1f %9.3f %9lld\n", i + 1,
                  r.prefix_cache ? "on" : "off", r.requests / r.wall, r.tokens / r.wall,
                  Percentile(r.ttft_ms, 0.5), Percentile(r.ttft_ms, 0.9),
                  Percentile(r.ttft_ms, 0.99), Percentile(r.later_ttft_ms, 0.5), r.hit_rate,
                  static_cast<long long>(r.evictions));
    }
    std::printf("medians on / off: tok/s %.2fx, TTFT p50 %.2fx, p90 %.2fx, turns 2+ p50 %.2fx\n",
                summary["on_over_off"].value("generated_tokens_per_second", 0.0),
                summary["on_over_off"].value("ttft_ms_p50", 0.0),
                summary["on_over_off"].value("ttft_ms_p90", 0.0),
                summary["on_over_off"].value("later_turns_ttft_ms_p50", 0.0));
    std::printf("times in ms; TTFT from sending the request; hit rate: prompt tokens reused / "
                "looked up (-1: not known)\n");
  }
  if (failed) std::printf("FAILED: some requests did not complete\n");
  if (mismatch) std::printf("MISMATCH: answers differ with the prefix cache on and off\n");
  return failed || mismatch ? 1 : 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"specinfer serving load benchmark"};
  std::string model, tokenizer, draft = "ngram", tree = "1,1,1,1", workload = "edit",
      chat_template;
  int threads = 2, requests = 32, max_tokens = 64, repeat = 1;
  std::string spec_budget = "auto", json_path, batch_drafts = "on";
  std::vector<int> concurrency = {1, 8, 32};
  std::string cluster, specinfer_bin;
  int conversations = 16, turns = 8, rounds = 2;
  app.add_option("-m,--model", model, "Model file (with --cluster: replaces the config's)");
  app.add_option("--cluster", cluster, "Benchmark a deployment started from this cluster config");
  app.add_option("--specinfer", specinfer_bin, "The specinfer binary (default: beside this one)");
  app.add_option("--tokenizer", tokenizer, "Tokenizer file (llama2.c)");
  app.add_option("--chat-template", chat_template,
                 "For models without one of their own: chatml, llama2, llama3 or gemma");
  app.add_option("-t,--threads", threads, "Engine threads")->check(CLI::Range(0, 256));
  app.add_option("--concurrency", concurrency, "Concurrent clients, one setting each")
      ->delimiter(',');
  app.add_option("--requests", requests, "Requests per setting (at least the concurrency)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-tokens", max_tokens, "Tokens per request")->check(CLI::Range(1, 4096));
  CLI::Option* draft_opt =
      app.add_option("--draft", draft, "Speculator of the speculation-on runs");
  app.add_option("--tree", tree, "Token-tree shape of the speculation-on runs");
  app.add_option("--workload", workload,
                 "edit (repeat a given text), open (free writing), or chat-multiturn (prefix "
                 "caching on vs off: conversations sharing a system prompt)")
      ->check(CLI::IsMember({"edit", "open", "chat-multiturn"}));
  app.add_option("--conversations", conversations, "chat-multiturn: concurrent conversations")
      ->check(CLI::Range(1, 1024));
  app.add_option("--turns", turns, "chat-multiturn: turns per conversation")
      ->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "chat-multiturn: pairs of runs (cache on and off)")
      ->check(CLI::Range(1, 100));
  app.add_option("--repeat", repeat, "Alternating off/on runs per concurrency (median ratio)")
      ->check(CLI::Range(1, 100));
  app.add_option("--batch-drafts", batch_drafts,
                 "In-process server: draft the sequences sharing a model draft together (on) or "
                 "one by one (off)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--spec-budget", spec_budget,
                 "In-process server: auto (adaptive tree depth), static (full shape) or "
                 "dynamic (dynamic trees, adaptive node budget)")
      ->check(CLI::IsMember({"auto", "static", "dynamic"}));
  app.add_option("--json", json_path,
                 "Write every run's figures and the medians to this file ('-': standard output, "
                 "instead of the table; chat-multiturn only)");
  float temperature = 0.0f, top_p = 1.0f;
  app.add_option("--temperature", temperature,
                 "Sampling temperature of every request (0: greedy, and texts compared)")
      ->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-p", top_p, "Nucleus mass of sampled requests")
      ->check(CLI::Range(0.001f, 1.0f));
  CLI11_PARSE(app, argc, argv);
  BenchSettings bs{concurrency, requests, max_tokens, repeat,      draft,
                   tree,        workload, json_path,  temperature, top_p};
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows the engine's per-step choices
  if (model.empty() && cluster.empty()) {
    std::fprintf(stderr, "error: --model or --cluster is required\n");
    return 1;
  }

  if (workload == "chat-multiturn") {
    return RunChatBenchmark(model, tokenizer, chat_template, threads, cluster, specinfer_bin,
                            conversations, turns, max_tokens, rounds, json_path);
  }
  const int max_c = *std::max_element(concurrency.begin(), concurrency.end());
  if (!cluster.empty()) {
    if (specinfer_bin.empty()) {
      std::error_code ec;
      specinfer_bin =
          (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "specinfer").string();
    }
    std::vector<std::string> args = {specinfer_bin, "cluster", "--config", cluster, "--any-ports",
                                     "--http-port", "0"};
    if (!model.empty()) {
      args.insert(args.end(), {"--model", model});
      if (!tokenizer.empty()) args.insert(args.end(), {"--tokenizer", tokenizer});
    }
    if (!chat_template.empty()) args.insert(args.end(), {"--chat-template", chat_template});
    ClusterChild child = StartCluster(args);
    if (child.port == 0) {
      std::fprintf(stderr, "error: the cluster did not start\n");
      if (child.pid > 0) {
        kill(child.pid, SIGKILL);
        waitpid(child.pid, nullptr, 0);
      }
      return 1;
    }
    if (draft_opt->count() == 0) bs.draft.clear();  // the deployment's speculators
    const int rc = RunBenchmark(
        child.port, "cluster " + cluster + (model.empty() ? "" : " (model " + model + ")"), bs);
    kill(child.pid, SIGTERM);
    int status = 0;
    waitpid(child.pid, &status, 0);
    return rc;
  }
  InferenceServerOptions o;
  o.engine.model_path = model;
  o.engine.tokenizer_path = tokenizer;
  o.engine.num_threads = threads;
  o.engine.context_length = 2048;
  // The server loads the draft at start: a client may name only model drafts it was started with.
  if (!bs.draft.empty()) o.engine.drafts = {bs.draft};
  o.chat_template = chat_template;  // KV for max_c sequences stays small
  o.queue.batch.max_sequences = max_c;
  ParseSpecBudgetMode(spec_budget, &o.queue.batch.spec_budget);
  o.queue.batch.batch_drafts = batch_drafts == "on";
  o.queue.max_queue = std::max(64, 2 * max_c);
  o.http.port = 0;
  o.http.threads = max_c + 8;
  o.enable_grpc = false;
  auto server_or = InferenceServer::Start(std::move(o));
  if (!server_or.ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<InferenceServer> server = std::move(server_or).value();
  const int rc = RunBenchmark(server->http_port(),
                              "model " + model + ", " + std::to_string(threads) +
                                  " threads, spec budget " + spec_budget + ", batched drafts " +
                                  batch_drafts,
                              bs);
  server->Shutdown();
  return rc;
}

int RunBenchmark(int port, const std::string& what, const BenchSettings& bs) {
  const std::vector<int>& concurrency = bs.concurrency;
  const int requests = bs.requests, max_tokens = bs.max_tokens;
  const std::string &draft = bs.draft, &tree = bs.tree, &workload = bs.workload;
  json runs = json::array();
  auto scrape = [&] {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  };

  std::vector<int> tree_widths;
  for (size_t p = 0, q; p < tree.size(); p = q + 1) {
    q = tree.find(',', p);
    if (q == std::string::npos) q = tree.size();
    tree_widths.push_back(std::stoi(tree.substr(p, q - p)));
  }
  const auto& texts = workload == "edit" ? kEditTexts : kOpenTexts;
  auto body = [&](int i, bool speculate) {
    const std::string& t = texts[i % texts.size()];
    json b = {{"messages",
               {{{"role", "user"},
                 {"content", workload == "edit" ? "Repeat this text exactly: " + t : t}}}},
              {"max_tokens", max_tokens},
              {"temperature", bs.temperature},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    if (bs.temperature > 0) {
      b["top_p"] = bs.top_p;
      b["seed"] = i;
    }
    if (speculate) {
      b["speculation"] = {{"enabled", true}, {"tree", tree_widths}};
      if (!draft.empty()) b["speculation"]["draft"] = {draft};
    }
    return b;
  };

  char sampling[64] = "greedy";
  if (bs.temperature > 0)
    std::snprintf(sampling, sizeof sampling, "sampled: temperature %g top_p %g", bs.temperature,
                  bs.top_p);
  std::printf("%s, workload %s, %d tokens per request, draft %s tree %s, %s\n", what.c_str(),
              workload.c_str(), max_tokens, draft.empty() ? "(the server's)" : draft.c_str(),
              tree.c_str(), sampling);
  std::printf("%-5s %-11s %8s %9s %9s %9s %9s %9s %9s %9s\n", "conc", "speculation", "req/s",
              "tok/s", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99");
  RunOne(port, body(0, false));  // warm-up (page the weights in)
  // And one speculative request: the adaptive controller's one-time calibration passes
  // (engine/spec_controller.h) happen in its first step, outside the measured runs.
  RunOne(port, body(0, true));
  std::map<int, std::string> text_off;  // request index -> text without speculation
  bool mismatch = false, failed = false;
  for (int c : concurrency) {
    const int n = std::max(requests, c);
    double tok_s_off = 0, tok_s_on = 0;  // of the current pair
    std::vector<double> ratios;
    // rep -1: an unmeasured run without speculation. The first run of a setting prefills its
    // prompts while the later ones find them in the prefix cache; without it the first pair's
    // "off" run paid that alone (measured: a 1.57x ratio where the later pairs gave 1.02x).
    for (int rep = -1; rep < 2 * bs.repeat; ++rep) {
      // Pairs alternate their order (off-on, on-off, ...), so that a machine that slows down or
      // speeds up during the runs does not favour either side of the ratio.
      const bool warmup = rep < 0;
      const bool second_of_pair = rep % 2 == 1;
      const bool speculate = rep >= 0 && (second_of_pair != ((rep / 2) % 2 == 1));
      if (rep >= 0 && !second_of_pair) tok_s_off = tok_s_on = 0;
      const std::string before = speculate ? scrape() : std::string();
      std::vector<Sample> samples(n);
      std::atomic<int> next{0};
      const auto t0 = Clock::now();
      std::vector<std::thread> clients;
      for (int k = 0; k < c; ++k) {
        clients.emplace_back([&] {
          for (int i; (i = next.fetch_add(1)) < n;) samples[i] = RunOne(port, body(i, speculate));
        });
      }
      for (std::thread& t : clients) t.join();
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      if (warmup) continue;
      std::vector<double> ttft, tpot;
      int64_t tokens = 0;
      for (int i = 0; i < n; ++i) {
        const Sample& s = samples[i];
        if (!s.ok) {
          failed = true;
          continue;
        }
        ttft.push_back(s.ttft * 1e3);
        tpot.push_back(s.tpot * 1e3);
        tokens += s.tokens;
        const int key = i % static_cast<int>(texts.size());
        if (bs.temperature > 0) continue;  // sampled: the same distribution, not the same text
        if (!speculate) text_off[key] = s.text;
        else if (text_off.count(key) && text_off[key] != s.text) mismatch = true;
      }
      const double tok_s = tokens / wall;
      (speculate ? tok_s_on : tok_s_off) = tok_s;
      std::printf("%-5d %-11s %8.2f %9.1f %9.1f %9.1f %9.1f %9.2f %9.2f %9.2f", c,
                  speculate ? "on" : "off", n / wall, tok_s, Percentile(ttft, 0.5),
                  Percentile(ttft, 0.9), Percentile(ttft, 0.99), Percentile(tpot, 0.5),
                  Percentile(tpot, 0.9), Percentile(tpot, 0.99));
      json run = {{"concurrency", c}, {"speculation", speculate}, {"requests", n},
                  {"tokens", tokens}, {"seconds", wall}, {"tok_s", tok_s},
                  {"ttft_p50_ms", Percentile(ttft, 0.5)}, {"tpot_p50_ms", Percentile(tpot, 0.5)}};
      if (second_of_pair && tok_s_off > 0 && tok_s_on > 0) {
        std::printf("   (pair: %.2fx tok/s)", tok_s_on / tok_s_off);
        ratios.push_back(tok_s_on / tok_s_off);
        run["ratio"] = tok_s_on / tok_s_off;
      }
      if (speculate) {
        // The run's decode passes and accepted tokens, and the controller's figures.
        const std::string after = scrape();
        const double passes = MetricValue(after, "specinfer_spec_llm_passes_total") -
                              MetricValue(before, "specinfer_spec_llm_passes_total");
        const double steps_on =
            MetricLabelled(after, "specinfer_spec_controller_steps_total{speculating=\"true\"}") -
            MetricLabelled(before, "specinfer_spec_controller_steps_total{speculating=\"true\"}");
        const double steps_off =
            MetricLabelled(after, "specinfer_spec_controller_steps_total{speculating=\"false\"}") -
            MetricLabelled(before, "specinfer_spec_controller_steps_total{speculating=\"false\"}");
        const double tpp = passes > 0 ? tokens / passes : 0;
        // Drafting per engine step (a batched draft counts once, split among its sequences).
        const double draft_s = MetricValue(after, "specinfer_spec_draft_seconds_total") -
                               MetricValue(before, "specinfer_spec_draft_seconds_total");
        const double steps = steps_on + steps_off;
        std::printf("   draft %.2f ms/step (%.1f%% of wall)", steps > 0 ? draft_s / steps * 1e3 : 0,
                    100 * draft_s / wall);
        run["draft_seconds"] = draft_s;
        const double budget = MetricValue(after, "specinfer_spec_budget_tokens_mean");
        const double pred = MetricValue(after, "specinfer_spec_predicted_gain");
        const double meas = MetricValue(after, "specinfer_spec_measured_gain");
        std::printf("   tok/pass %.2f, speculating steps %.0f/%.0f, budget %.1f tok/step, "
                    "gain predicted %.2f measured %.2f",
                    tpp, steps_on, steps_on + steps_off, budget, pred, meas);
        run["tokens_per_pass"] = tpp;
        run["speculating_steps"] = steps_on;
        run["controller_steps"] = steps_on + steps_off;
        run["budget_tokens_mean"] = budget;
        run["predicted_gain"] = pred;
        run["measured_gain"] = meas;
      }
      runs.push_back(run);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (bs.repeat > 1) {
      std::vector<double> r = ratios;
      std::sort(r.begin(), r.end());
      std::printf("%-5d median on/off tok/s ratio of %zu pairs: %.2fx\n", c, r.size(),
                  r.empty() ? 0.0 : r[r.size() / 2]);
    }
  }
  if (!bs.json_path.empty()) {
    json doc = {{"what", what},       {"workload", workload}, {"max_tokens", max_tokens},
                {"draft", draft},     {"tree", tree},         {"runs", runs}};
    std::ofstream(bs.json_path) << doc.dump(2) << "\n";
  }
  std::printf("times in ms; TTFT from sending the request; TPOT per request after its first "
              "token\n");
  if (failed) std::printf("FAILED: some requests did not complete\n");
  if (mismatch) std::printf("MISMATCH: speculative text differs from plain text\n");
  return failed || mismatch ? 1 : 0;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) { return specinfer::Main(argc, argv); }
