#include "server/scheduler.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

#include "server/text_output.h"

namespace specinfer {

namespace {
double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

const char* FinishLabel(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "error";
}
}  // namespace

// ---- ResponseStream ----------------------------------------------------------------------------

ResponseStream::ResponseStream(int32_t num_sequences)
    : num_sequences_(num_sequences), submitted_at_(Clock::now()), open_sequences_(num_sequences) {}

void ResponseStream::Push(StreamEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (event.type != StreamEvent::Type::kDelta) --open_sequences_;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<StreamEvent> ResponseStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || open_sequences_ == 0; });
  if (events_.empty()) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool ResponseStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_sequences_ == 0 && events_.empty();
}

// ---- Scheduler ---------------------------------------------------------------------------------

Scheduler::Scheduler(Engine& engine, ServerMetrics& metrics, SchedulerOptions options)
    : engine_(engine), metrics_(metrics), options_(options), kv_total_(engine.kv().num_blocks()) {
  kv_used_ = engine.kv().used_blocks();
  worker_ = std::thread([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() { Shutdown(); }

StatusOr<std::shared_ptr<ResponseStream>> Scheduler::Submit(std::vector<SequenceJob> jobs) {
  if (jobs.empty()) return InvalidArgumentError("a request needs at least one sequence");
  auto stream = std::make_shared<ResponseStream>(static_cast<int32_t>(jobs.size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return UnavailableError("the server is shutting down");
    if (queue_.size() + jobs.size() > static_cast<size_t>(options_.max_queue)) {
      return UnavailableError("server busy: " + std::to_string(queue_.size()) +
                              " sequences are queued (limit " + std::to_string(options_.max_queue) +
                              "); retry later");
    }
    for (SequenceJob& j : jobs) queue_.push_back(Job{std::move(j), stream});
  }
  cv_.notify_one();
  return stream;
}

void Scheduler::Cancel(const std::shared_ptr<ResponseStream>& stream) {
  if (!stream || stream->cancelled_.exchange(true)) return;
  std::vector<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->stream == stream) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Job& j : dropped) {
    StreamEvent e;
    e.type = StreamEvent::Type::kFinished;
    e.index = j.job.index;
    e.finish_reason = FinishReason::kCancelled;
    e.prompt_tokens = static_cast<int32_t>(j.job.generate.prompt_tokens.size());
    stream->Push(std::move(e));
    metrics_.CountFinished("cancelled");
  }
}

void Scheduler::Shutdown() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    dropped.swap(queue_);
  }
  shutdown_ = true;
  cv_.notify_all();
  for (Job& j : dropped) {
    StreamEvent e;
    e.type = StreamEvent::Type::kError;
    e.index = j.job.index;
    e.error = UnavailableError("the server is shutting down");
    j.stream->Push(std::move(e));
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

SchedulerGauges Scheduler::gauges() const {
  SchedulerGauges g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g.queued = static_cast<int64_t>(queue_.size());
  }
  g.running = running_.load();
  g.kv_blocks_used = kv_used_.load();
  g.kv_blocks_total = kv_total_;
  return g;
}

void Scheduler::PublishKv() { kv_used_ = engine_.kv().used_blocks(); }

void Scheduler::WorkerLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // Shutdown() fails whatever is still queued
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = 1;
    }
    Run(job);
    running_ = 0;
  }
}

void Scheduler::Run(Job& job) {
  try {
    RunSequence(job);
  } catch (const std::exception& ex) {  // e.g. std::bad_alloc: fail this sequence only
    spdlog::error("sequence failed with an exception: {}", ex.what());
    StreamEvent e;
    e.type = StreamEvent::Type::kError;
    e.index = job.job.index;
    e.error = InternalError(std::string("generation failed: ") + ex.what());
    job.stream->Push(std::move(e));
    metrics_.CountFinished("error");
  }
  PublishKv();
}

void Scheduler::RunSequence(Job& job) {
  ResponseStream& stream = *job.stream;
  const SequenceJob& sj = job.job;
  const GenerateRequest& req = sj.generate;
  const int32_t prompt_len = static_cast<int32_t>(req.prompt_tokens.size());
  if (stream.cancelled() || shutdown_) {
    StreamEvent e;
    e.type = StreamEvent::Type::kFinished;
    e.index = sj.index;
    e.finish_reason = FinishReason::kCancelled;
    e.prompt_tokens = prompt_len;
    stream.Push(std::move(e));
    metrics_.CountFinished("cancelled");
    return;
  }

  CompletionText text(engine_.tokenizer(), req.prompt_tokens.back(), req.stop_tokens,
                      sj.stop_strings);
  const bool want_logprobs = sj.top_logprobs >= 0;
  // With logprobs, deltas wait for the scoring pass after generation (see server/logprobs.h).
  std::vector<StreamEvent> held;
  auto last = ResponseStream::Clock::now();
  bool first = true;
  auto on_token = [&](int32_t id) {
    const auto now = ResponseStream::Clock::now();
    if (first) {
      if (!stream.first_token_seen_.exchange(true))
        metrics_.ObserveTimeToFirstToken(Seconds(now - stream.submitted_at()));
      first = false;
    } else {
      metrics_.ObserveInterTokenLatency(Seconds(now - last));
    }
    last = now;
    PublishKv();
    StreamEvent e;
    e.index = sj.index;
    e.text = text.Push(id);
    e.tokens = {id};
    if (want_logprobs)
      held.push_back(std::move(e));
    else
      stream.Push(std::move(e));
    return !stream.cancelled() && !shutdown_ && !text.stopped();
  };

  metrics_.AddPromptTokens(prompt_len);
  GenerateRequest run = req;
  if (sj.speculation.enabled) {
    // The request's speculators (or the ones loaded at start), and its tree (or the default).
    std::vector<std::string> names = options_.default_drafts;
    if (!sj.speculation.drafts.empty()) {
      names.clear();
      for (const DraftSpec& d : sj.speculation.drafts) names.push_back(d.ToString());
    }
    {
      for (const std::string& name : names) {
        auto s = engine_.GetSpeculator(name);
        if (!s.ok()) {
          StreamEvent e;
          e.type = StreamEvent::Type::kError;
          e.index = sj.index;
          e.error = s.status();
          stream.Push(std::move(e));
          metrics_.CountFinished("error");
          return;
        }
        run.speculators.push_back(*s);
      }
    }
    run.tree_shape = sj.speculation.tree.empty() ? options_.default_tree
                                                 : TreeShape{sj.speculation.tree};
  }
  auto result = engine_.Generate(run, on_token);
  PublishKv();
  if (!result.ok()) {
    StreamEvent e;
    e.type = StreamEvent::Type::kError;
    e.index = sj.index;
    e.error = result.status();
    stream.Push(std::move(e));
    metrics_.CountFinished("error");
    return;
  }
  const int32_t generated = static_cast<int32_t>(result->tokens.size());
  metrics_.AddGeneratedTokens(generated);
  if (!run.speculators.empty()) {
    const SpeculationStats& sp = result->stats.spec;
    SpeculationCounters c;
    c.llm_passes = result->stats.decode_passes;
    c.accepted_tokens = sp.accepted_tokens;
    c.accepted_by_depth = sp.accepted_at_depth;
    for (size_t i = 0; i < sp.speculator_names.size(); ++i)
      c.accepted_by_speculator.emplace_back(sp.speculator_names[i], sp.accepted_by[i]);
    metrics_.AddSpeculation(c);
  }
  FinishReason reason = result->finish_reason;
  if (reason == FinishReason::kCancelled && text.stopped()) reason = FinishReason::kStop;

  if (want_logprobs && reason != FinishReason::kCancelled) {
    auto scored = TeacherForcedLogprobs(engine_.runner(), engine_.kv(), req.prompt_tokens,
                                        result->tokens, sj.top_logprobs, req.prefill_chunk);
    PublishKv();
    if (!scored.ok() || scored->size() != held.size()) {
      StreamEvent e;
      e.type = StreamEvent::Type::kError;
      e.index = sj.index;
      e.error = scored.ok() ? InternalError("logprob pass returned a wrong count")
                            : scored.status().WithContext("computing logprobs");
      stream.Push(std::move(e));
      metrics_.CountFinished("error");
      return;
    }
    for (size_t i = 0; i < held.size(); ++i) {
      held[i].logprobs = {std::move((*scored)[i])};
      stream.Push(std::move(held[i]));
    }
  }

  StreamEvent done;
  done.type = StreamEvent::Type::kFinished;
  done.index = sj.index;
  done.text = reason == FinishReason::kCancelled ? std::string() : text.Finish();
  done.finish_reason = reason;
  done.prompt_tokens = prompt_len;
  done.completion_tokens = generated;
  stream.Push(std::move(done));
  metrics_.CountFinished(FinishLabel(reason));
}

}  // namespace specinfer
