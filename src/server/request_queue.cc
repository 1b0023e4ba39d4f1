#include "server/request_queue.h"

#include <utility>

#include "server/output_processor.h"
#include "spec/speculator.h"

namespace specinfer {

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

// ---- RequestQueue ------------------------------------------------------------------------------

RequestQueue::RequestQueue(Engine& engine, ServerMetrics& metrics, RequestQueueOptions options)
    : engine_(engine),
      metrics_(metrics),
      options_(std::move(options)),
      output_(std::make_unique<OutputProcessor>(engine.tokenizer(), metrics)),
      kv_total_(engine.kv().num_blocks()) {
  kv_used_ = engine.kv().used_blocks();
  worker_ = std::thread([this] { WorkerLoop(); });
}

RequestQueue::~RequestQueue() { Shutdown(); }

StatusOr<std::shared_ptr<ResponseStream>> RequestQueue::Submit(std::vector<SequenceJob> jobs) {
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

void RequestQueue::Cancel(const std::shared_ptr<ResponseStream>& stream) {
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
  for (Job& j : dropped) output_->Cancelled(*stream, j.job);
}

void RequestQueue::Shutdown() {
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
    output_->Failed(*j.stream, j.job, UnavailableError("the server is shutting down"),
                    /*counted=*/false);
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

ServingGauges RequestQueue::gauges() const {
  ServingGauges g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g.queued = static_cast<int64_t>(queue_.size());
  }
  g.queued += waiting_head_.load();
  g.running = running_.load();
  g.kv_blocks_used = kv_used_.load();
  g.kv_blocks_total = kv_total_;
  g.kv_blocks_cached = kv_cached_.load();
  g.prefix_queried_tokens = prefix_queried_.load();
  g.prefix_hit_tokens = prefix_hit_.load();
  g.prefix_evictions = prefix_evictions_.load();
  g.draft_sessions = DraftSession::live();
  std::lock_guard<std::mutex> lock(spec_mu_);
  g.spec_steps = spec_.steps;
  g.spec_speculating_steps = spec_.speculating_steps;
  g.spec_budget_tokens = spec_.budget_tokens;
  g.spec_budget_tokens_mean = spec_.budget_tokens_mean;
  g.spec_predicted_gain = spec_.predicted_gain;
  g.spec_measured_gain = spec_.measured_gain;
  return g;
}

void RequestQueue::PublishKv() {
  kv_used_ = engine_.kv().used_blocks();
  const PrefixCacheStats p = engine_.kv().prefix_stats();
  kv_cached_ = p.cached_blocks;
  prefix_queried_ = p.lookup_tokens;
  prefix_hit_ = p.hit_tokens;
  prefix_evictions_ = p.evictions;
}

void RequestQueue::WorkerLoop() {
  EngineCore core(engine_.runner(), engine_.kv(), options_.batch);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || head_ || !core.idle(); });
      if (stopping_) break;
    }
    Admit(core);
    core.Step();
    PublishKv();
    const SpecControllerSnapshot spec = core.spec_controller().Snapshot();
    std::lock_guard<std::mutex> lock(spec_mu_);
    spec_ = spec;
  }
  // Shutdown: Shutdown() failed the queue; the head and the running sequences end here.
  if (head_) {
    output_->Failed(*head_->stream, head_->job, UnavailableError("the server is shutting down"));
    head_.reset();
    waiting_head_ = 0;
  }
  core.CancelAll();
  PublishKv();
}

void RequestQueue::Admit(EngineCore& core) {
  for (;;) {
    if (!head_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      head_ = std::move(queue_.front());
      queue_.pop_front();
      waiting_head_ = 1;
    }
    if (Start(core, *head_) == EngineCore::Admission::kNoRoom) return;  // wait
    head_.reset();
    waiting_head_ = 0;
  }
}

StatusOr<GenerateRequest> RequestQueue::ToGenerateRequest(const SequenceJob& sj) {
  GenerateRequest run = sj.generate;
  run.callback_logits = sj.top_logprobs >= 0;  // only logprobs read them (SequenceOutput)
  if (!sj.speculation.enabled) return run;
  // The request's speculators (or the ones loaded at start), and its tree (or the default).
  std::vector<std::string> names = options_.default_drafts;
  if (!sj.speculation.drafts.empty()) {
    names.clear();
    for (const DraftSpec& d : sj.speculation.drafts) names.push_back(d.ToString());
  }
  for (const std::string& name : names) {
    SI_ASSIGN_OR_RETURN(Speculator * s, engine_.GetSpeculator(name));
    run.speculators.push_back(s);
  }
  run.tree_shape =
      sj.speculation.tree.empty() ? options_.default_tree : TreeShape{sj.speculation.tree};
  return run;
}

EngineCore::Admission RequestQueue::Start(EngineCore& core, Job& job) {
  ResponseStream& stream = *job.stream;
  const SequenceJob& sj = job.job;
  if (stream.cancelled() || shutdown_) {
    output_->Cancelled(stream, sj);
    return EngineCore::Admission::kAdmitted;  // done with it
  }
  auto run = ToGenerateRequest(sj);
  if (!run.ok()) {
    output_->Failed(stream, sj, run.status());
    return EngineCore::Admission::kAdmitted;
  }

  // The callbacks share the sequence's output; it lives as long as the engine core holds them.
  std::shared_ptr<SequenceOutput> out = output_->Open(job.stream, sj, !run->speculators.empty());
  auto on_token = [this, out](int32_t id, std::span<const float> logits) {
    const bool more = out->OnToken(id, logits);
    return more && !out->stream().cancelled() && !shutdown_;
  };
  auto on_done = [this, out](StatusOr<GenerateResult> outcome) {
    --running_;  // before the final event, so whoever reads it sees the gauge settled
    PublishKv();
    out->OnDone(std::move(outcome));
  };
  auto cancelled = [this, out] { return out->stream().cancelled() || shutdown_.load(); };

  auto admitted = core.Add(std::move(run).value(), on_token, on_done, cancelled);
  if (!admitted.ok()) {
    output_->Failed(stream, sj, admitted.status());
    return EngineCore::Admission::kAdmitted;
  }
  if (*admitted == EngineCore::Admission::kAdmitted) {
    ++running_;
    metrics_.AddPromptTokens(static_cast<int32_t>(sj.generate.prompt_tokens.size()));
  }
  return *admitted;
}

}  // namespace specinfer
