// An SSM worker: a gRPC server (service specinfer.worker.SsmWorker, proto/ssm_worker.proto) that
// hosts one speculator and proposes token trees for the request manager's sequences.
//
// The worker loads `model_path` (the LLM itself, or any model with the LLM's vocabulary) and
// creates the speculator `speculator` on it (spec/speculator.h: "layers:K" of its own copy of
// the model, "model:PATH" a separate draft checked against that vocabulary, "ngram[:N]"). It
// keeps one DraftSession per session key (a model draft's KV cache is sized for max_sessions),
// fed with the sequence's committed tokens as deltas; a session idle for idle_timeout is
// reclaimed, and a full worker answers BUSY (the manager decodes that step without it).
//
// A model or layers draft runs on the backend `backend` names (backend/registry.h), on GPU
// `device` for "cuda" (a layers draft there holds its own copy of its layers; the LLM file is
// still mapped on the host for them); the drafts' passes are batch-invariant on either, so a
// worker's trees do not depend on what else it drafts at the time. "ngram" runs no model.
//
// Every request field is validated (dist/ssm_wire.h); a malformed item fails the whole call with
// INVALID_ARGUMENT and changes no session. Speculate calls run one at a time (the speculator's
// sessions share one runner); the items of one call are drafted together
// (Speculator::ProposeBatch: a model draft runs one pass per tree level for all of them), with
// the trees each item would get alone.
//
// Logs name the worker by `label`, e.g. "ssm[1] 127.0.0.1:5102 ...".
//
// Thread safety: Start/port/Wait/Shutdown from the controlling thread; RPCs on gRPC's threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "specinfer/status.h"

namespace specinfer {

struct SsmWorkerOptions {
  std::string model_path;
  std::string tokenizer_path;     // "": the model's own
  std::string speculator = "ngram";
  // Where a model or layers speculator runs: a registered backend (backend/registry.h).
  std::string backend = "cpu";
  int32_t device = 0;             // GPU backends: which device
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one (see port())
  std::string label = "ssm[0]";
  int32_t num_threads = 1;        // 0: all hardware threads
  int32_t context_length = 0;     // 0: the model's own; may only shrink it
  int32_t max_sessions = 16;
  int32_t kv_block_size = 16;
  bool dequantize = false;
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(5)};
};

class SsmWorkerServer {
 public:
  // Loads the model, creates the speculator and starts serving. InvalidArgument for bad options
  // or a bad spec; load errors and the backend's pass through (NotFound or FailedPrecondition
  // for a backend this program lacks, FailedPrecondition for a missing device); Unavailable if
  // the address cannot be bound.
  static StatusOr<std::unique_ptr<SsmWorkerServer>> Start(const SsmWorkerOptions& options);
  ~SsmWorkerServer();  // Shutdown()

  int port() const;
  std::string label() const;
  // Blocks until Shutdown() (from another thread).
  void Wait();
  // Stops serving (running calls get a short grace period). Idempotent.
  void Shutdown();

  struct Impl;

 private:
  explicit SsmWorkerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specinfer
