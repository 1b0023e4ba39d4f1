// The request scheduler between the frontends and the Engine.
//
// Frontend threads (HTTP handlers, gRPC handlers; any number) Submit() the sequences of a
// request and read its ResponseStream; one worker thread owns the Engine and runs the queued
// sequences one at a time in FIFO order (Engine::Generate serves a single sequence and is not
// thread-safe). Tokens reach the stream from the generator's token callback as they are chosen,
// turned into text (server/text_output.h) on the worker, so stop strings end generation at the
// exact token.
//
//   frontend ──Submit(jobs)──> [bounded FIFO queue] ──> worker: Engine::Generate(job, on_token)
//      ^                                                     │
//      └──────────── ResponseStream (events) <───────────────┘
//
// Admission: at most `max_queue` sequences wait; a request that does not fit is refused whole
// with Unavailable ("server busy"), which the gateway answers with 503.
//
// Cancellation: Cancel() (a frontend whose client disconnected) drops the request's queued
// sequences at once and makes the running one's token callback return false, so Generator stops
// before its next forward pass and frees the sequence's KV blocks on return. Each cancelled
// sequence still gets its final event (finish reason kCancelled).
//
// Failure isolation: an error (or exception) in one sequence becomes that sequence's kError
// event; the worker goes on with the next one.
//
// Replacing the worker: a continuous-batching request manager can take this class's place
// without touching the frontends. What they rely on is only Submit / Cancel / gauges / engine()
// and the per-sequence event order documented on StreamEvent; events of different sequences of
// one request may then interleave (the frontends already route by StreamEvent::index).
//
// Thread safety: every public method may be called from any thread. engine() gives frontends the
// Engine's immutable parts (tokenizer, chat template, config) for tokenization; only the worker
// calls Engine::Generate or touches the runner and KV cache.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/thread_annotations.h"

namespace specinfer {

// The events of one request, produced by the scheduler and consumed by one frontend thread.
class ResponseStream {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ResponseStream(int32_t num_sequences);

  // The next event, waiting up to `timeout`; nullopt on timeout or when finished().
  std::optional<StreamEvent> Next(std::chrono::milliseconds timeout) SI_EXCLUDES(mu_);
  // Every sequence has had its final event and every event has been taken.
  bool finished() const SI_EXCLUDES(mu_);
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  int32_t num_sequences() const { return num_sequences_; }
  Clock::time_point submitted_at() const { return submitted_at_; }

 private:
  friend class Scheduler;
  void Push(StreamEvent event) SI_EXCLUDES(mu_);

  const int32_t num_sequences_;
  const Clock::time_point submitted_at_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_ SI_GUARDED_BY(mu_);
  int32_t open_sequences_ SI_GUARDED_BY(mu_);  // sequences whose final event is not pushed yet
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> first_token_seen_{false};  // for the time-to-first-token histogram
};

struct SchedulerOptions {
  int32_t max_queue = 64;  // sequences waiting (not counting the running one)
  // Token-tree shape for requests that enable speculation without giving one.
  TreeShape default_tree = TreeShape{{1, 1, 3, 1, 1, 1, 1, 1}};
  // Speculators for requests that enable speculation without naming any (spec strings).
  std::vector<std::string> default_drafts = {"ngram"};
};

class Scheduler {
 public:
  // Starts the worker. `engine` and `metrics` must outlive the Scheduler.
  Scheduler(Engine& engine, ServerMetrics& metrics, SchedulerOptions options);
  ~Scheduler();  // Shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the sequences of one request, all or none. Unavailable when the queue cannot take
  // them all ("server busy") or after Shutdown; InvalidArgument for an empty list.
  StatusOr<std::shared_ptr<ResponseStream>> Submit(std::vector<SequenceJob> jobs) SI_EXCLUDES(mu_);

  // Cancels a request: queued sequences are dropped now, the running one stops at its next
  // token. Idempotent; a finished stream is left as it is.
  void Cancel(const std::shared_ptr<ResponseStream>& stream) SI_EXCLUDES(mu_);

  // Stops admitting requests, fails the queued ones (Unavailable), cancels the running one and
  // joins the worker. Idempotent.
  void Shutdown() SI_EXCLUDES(mu_);

  const Engine& engine() const { return engine_; }
  SchedulerGauges gauges() const SI_EXCLUDES(mu_);
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Job {
    SequenceJob job;
    std::shared_ptr<ResponseStream> stream;
  };

  void WorkerLoop() SI_EXCLUDES(mu_);
  void Run(Job& job);
  void RunSequence(Job& job);
  void PublishKv();

  Engine& engine_;
  ServerMetrics& metrics_;
  const SchedulerOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_ SI_GUARDED_BY(mu_);
  bool stopping_ SI_GUARDED_BY(mu_) = false;

  std::atomic<bool> shutdown_{false};  // read by the running sequence's token callback
  std::atomic<int64_t> running_{0};
  std::atomic<int64_t> kv_used_{0};
  const int64_t kv_total_;
  std::thread worker_;
};

}  // namespace specinfer
