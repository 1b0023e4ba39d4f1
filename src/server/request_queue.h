// The request queue between the frontends and the engine core: admission, limits, FIFO order,
// cancellation and shutdown, and the worker thread that feeds the queue's sequences to the
// Engine's engine core (engine/engine_core.h) and steps it.
//
// Frontend threads (HTTP handlers, gRPC handlers; any number) Submit() the sequences of a
// request and read its ResponseStream; one worker thread owns the Engine's runner and KV cache.
// Between steps it admits waiting sequences in FIFO order while the KV cache and the batch
// limits have room for them (resolving each one's speculators and tree), then runs one step: one
// LLM pass holding every running sequence's token tree plus prefill chunks of newcomers. What
// each sequence produces reaches its stream through the output processor
// (server/output_processor.h): text, stop strings and logprobs as tokens are chosen.
//
//   frontend ──Submit(jobs)──> [bounded FIFO queue] ──admit──> EngineCore ──Step()──┐
//      ^                                                      (running set)          │
//      └── ResponseStream (events) <── OutputProcessor <── tokens, outcomes <────────┘
//
// Admission: at most `max_queue` sequences wait; a request that does not fit is refused whole
// with Unavailable ("server busy"), which the gateway answers with 503. A sequence that could
// never fit the KV cache is failed with ResourceExhausted.
//
// Cancellation: Cancel() (a frontend whose client disconnected) drops the request's queued
// sequences at once; running ones end before the next step (their cancel poll) or at their
// next token, and free their KV blocks then. Each cancelled sequence still gets its final event
// (finish reason kCancelled).
//
// Failure isolation: an error (or exception) in one sequence becomes that sequence's kError
// event; a failed LLM pass fails the sequences in it; the worker goes on with the others.
//
// Events of different sequences (of one request or of many) interleave; per sequence the order
// documented on StreamEvent holds, and frontends route by StreamEvent::index.
//
// Thread safety: every public method may be called from any thread. engine() gives frontends the
// Engine's immutable parts (tokenizer, chat template, config) for tokenization; only the worker
// touches the runner and KV cache.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/thread_annotations.h"

namespace specinfer {

class OutputProcessor;

// The events of one request, produced by the request queue's worker (through the output
// processor) and consumed by one frontend thread.
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
  friend class RequestQueue;
  friend class OutputProcessor;
  friend class SequenceOutput;
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

struct RequestQueueOptions {
  int32_t max_queue = 64;  // sequences waiting (not counting running ones)
  // Running sequences and tokens per LLM pass. max_sequences must not exceed the Engine's
  // max_sequences (its draft models keep KV for that many).
  BatchOptions batch;
  // Token-tree shape for requests that enable speculation without giving one.
  TreeShape default_tree = TreeShape::Default();
  // Speculators for requests that enable speculation without naming any (spec strings).
  std::vector<std::string> default_drafts = {"ngram"};
};

class RequestQueue {
 public:
  // Starts the worker. `engine` and `metrics` must outlive the RequestQueue.
  RequestQueue(Engine& engine, ServerMetrics& metrics, RequestQueueOptions options);
  ~RequestQueue();  // Shutdown()
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

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
  ServingGauges gauges() const SI_EXCLUDES(mu_);
  const RequestQueueOptions& options() const { return options_; }

 private:
  struct Job {
    SequenceJob job;
    std::shared_ptr<ResponseStream> stream;
  };

  void WorkerLoop() SI_EXCLUDES(mu_);
  // Admits waiting sequences while there is room; returns when the queue's head must wait.
  void Admit(EngineCore& core) SI_EXCLUDES(mu_);
  // Starts one job on `core`: kNoRoom leaves it waiting; an error or a cancelled stream ends it
  // with its final event.
  EngineCore::Admission Start(EngineCore& core, Job& job);
  // The engine's request for `job`: its speculators (or the default ones) and tree (or the
  // default) when it enables speculation.
  StatusOr<GenerateRequest> ToGenerateRequest(const SequenceJob& job);
  void PublishKv();

  Engine& engine_;
  ServerMetrics& metrics_;
  const RequestQueueOptions options_;
  const std::unique_ptr<OutputProcessor> output_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_ SI_GUARDED_BY(mu_);
  bool stopping_ SI_GUARDED_BY(mu_) = false;

  std::optional<Job> head_;  // worker only: popped from the queue, waiting for room
  std::atomic<bool> shutdown_{false};  // read by the running sequences' callbacks
  std::atomic<int64_t> waiting_head_{0};
  std::atomic<int64_t> running_{0};
  std::atomic<int64_t> kv_used_{0};
  // KvCacheManager::prefix_stats(), published by the worker (the KV cache's one thread).
  std::atomic<int64_t> kv_cached_{0}, prefix_queried_{0}, prefix_hit_{0}, prefix_evictions_{0};
  mutable std::mutex spec_mu_;  // guards spec_: the controller's figures after the last step
  SpecControllerSnapshot spec_ SI_GUARDED_BY(spec_mu_);
  const int64_t kv_total_;
  std::thread worker_;
};

}  // namespace specinfer
