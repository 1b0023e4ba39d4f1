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
    // The worker's head (popped, waiting for room) still counts as waiting.
    const size_t waiting = queue_.size() + static_cast<size_t>(waiting_head_.load());
    if (waiting + jobs.size() > static_cast<size_t>(options_.max_queue)) {
      return UnavailableError("server busy: " + std::to_string(waiting) +
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
  g.queued += waiting_head_.load();
  g.running = running_.load();
  g.kv_blocks_used = kv_used_.load();
  g.kv_blocks_total = kv_total_;
  return g;
}

void Scheduler::PublishKv() { kv_used_ = engine_.kv().used_blocks(); }

// What the worker keeps for one running sequence; shared by its callbacks.
struct Scheduler::Active {
  Active(Job j, const Tokenizer& tok)
      : job(std::move(j)),
        text(tok, job.job.generate.prompt_tokens.back(), job.job.generate.stop_tokens,
             job.job.stop_strings) {}
  Job job;
  CompletionText text;
  bool speculative = false;
  bool first = true;
  ResponseStream::Clock::time_point last;
};

void Scheduler::WorkerLoop() {
  BatchGenerator batch(engine_.runner(), engine_.kv(), options_.batch);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || head_ || !batch.idle(); });
      if (stopping_) break;
    }
    Admit(batch);
    batch.Step();
    PublishKv();
  }
  // Shutdown: Shutdown() failed the queue; the head and the running sequences end here.
  if (head_) {
    FailJob(*head_, UnavailableError("the server is shutting down"));
    head_.reset();
    waiting_head_ = 0;
  }
  batch.CancelAll();
  PublishKv();
}

void Scheduler::Admit(BatchGenerator& batch) {
  for (;;) {
    if (!head_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      head_ = std::move(queue_.front());
      queue_.pop_front();
      waiting_head_ = 1;
    }
    if (Start(batch, *head_) == BatchGenerator::Admission::kNoRoom) return;  // wait
    head_.reset();
    waiting_head_ = 0;
  }
}

void Scheduler::FailJob(Job& job, Status error) {
  StreamEvent e;
  e.type = StreamEvent::Type::kError;
  e.index = job.job.index;
  e.error = std::move(error);
  job.stream->Push(std::move(e));
  metrics_.CountFinished("error");
}

BatchGenerator::Admission Scheduler::Start(BatchGenerator& batch, Job& job) {
  ResponseStream& stream = *job.stream;
  const SequenceJob& sj = job.job;
  const int32_t prompt_len = static_cast<int32_t>(sj.generate.prompt_tokens.size());
  if (stream.cancelled() || shutdown_) {
    StreamEvent e;
    e.type = StreamEvent::Type::kFinished;
    e.index = sj.index;
    e.finish_reason = FinishReason::kCancelled;
    e.prompt_tokens = prompt_len;
    stream.Push(std::move(e));
    metrics_.CountFinished("cancelled");
    return BatchGenerator::Admission::kAdmitted;  // done with it
  }

  GenerateRequest run = sj.generate;
  if (sj.speculation.enabled) {
    // The request's speculators (or the ones loaded at start), and its tree (or the default).
    std::vector<std::string> names = options_.default_drafts;
    if (!sj.speculation.drafts.empty()) {
      names.clear();
      for (const DraftSpec& d : sj.speculation.drafts) names.push_back(d.ToString());
    }
    for (const std::string& name : names) {
      auto s = engine_.GetSpeculator(name);
      if (!s.ok()) {
        FailJob(job, s.status());
        return BatchGenerator::Admission::kAdmitted;
      }
      run.speculators.push_back(*s);
    }
    run.tree_shape = sj.speculation.tree.empty() ? options_.default_tree
                                                 : TreeShape{sj.speculation.tree};
  }

  // The callbacks share the sequence's state; it lives as long as the generator holds them.
  auto a = std::make_shared<Active>(job, engine_.tokenizer());
  a->speculative = !run.speculators.empty();
  auto on_token = [this, a](int32_t id, std::span<const float> logits) {
    ResponseStream& st = *a->job.stream;
    const SequenceJob& j = a->job.job;
    const auto now = ResponseStream::Clock::now();
    if (a->first) {
      if (!st.first_token_seen_.exchange(true))
        metrics_.ObserveTimeToFirstToken(Seconds(now - st.submitted_at()));
      a->first = false;
    } else {
      metrics_.ObserveInterTokenLatency(Seconds(now - a->last));
    }
    a->last = now;
    StreamEvent e;
    e.index = j.index;
    e.text = a->text.Push(id);
    e.tokens = {id};
    if (j.top_logprobs >= 0) e.logprobs = {LogprobsFromLogits(logits, id, j.top_logprobs)};
    st.Push(std::move(e));
    return !st.cancelled() && !shutdown_ && !a->text.stopped();
  };
  auto on_done = [this, a](StatusOr<GenerateResult> outcome) { Finish(*a, std::move(outcome)); };
  auto cancelled = [this, a] { return a->job.stream->cancelled() || shutdown_.load(); };

  auto admitted = batch.Add(std::move(run), on_token, on_done, cancelled);
  if (!admitted.ok()) {
    FailJob(job, admitted.status());
    return BatchGenerator::Admission::kAdmitted;
  }
  if (*admitted == BatchGenerator::Admission::kAdmitted) {
    ++running_;
    metrics_.AddPromptTokens(prompt_len);
  }
  return *admitted;
}

void Scheduler::Finish(Active& a, StatusOr<GenerateResult> outcome) {
  ResponseStream& stream = *a.job.stream;
  const SequenceJob& sj = a.job.job;
  --running_;  // before the final event, so whoever reads it sees the gauge settled
  PublishKv();
  if (!outcome.ok()) {
    FailJob(a.job, outcome.status());
    return;
  }
  const GenerateResult& result = *outcome;
  const int32_t generated = static_cast<int32_t>(result.tokens.size());
  metrics_.AddGeneratedTokens(generated);
  if (a.speculative) {
    const SpeculationStats& sp = result.stats.spec;
    SpeculationCounters c;
    c.llm_passes = result.stats.decode_passes;
    c.accepted_tokens = sp.accepted_tokens;
    c.accepted_by_depth = sp.accepted_at_depth;
    for (size_t i = 0; i < sp.speculator_names.size(); ++i)
      c.accepted_by_speculator.emplace_back(sp.speculator_names[i], sp.accepted_by[i]);
    metrics_.AddSpeculation(c);
  }
  FinishReason reason = result.finish_reason;
  if (reason == FinishReason::kCancelled && a.text.stopped()) reason = FinishReason::kStop;

  StreamEvent done;
  done.type = StreamEvent::Type::kFinished;
  done.index = sj.index;
  done.text = reason == FinishReason::kCancelled ? std::string() : a.text.Finish();
  done.finish_reason = reason;
  done.prompt_tokens = static_cast<int32_t>(sj.generate.prompt_tokens.size());
  done.completion_tokens = generated;
  stream.Push(std::move(done));
  metrics_.CountFinished(FinishLabel(reason));
}

}  // namespace specinfer
