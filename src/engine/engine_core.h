// The engine core: many sequences on one ModelRunner, one LLM pass per Step(). Its scheduler
// (engine/core_scheduler.h) decides each step's batch, its executor (engine/executor.h) runs the
// pass, and each sequence's SpeculativeStep (engine/speculative_step.h) verifies its own tree.
// A step's data flows down once and its results up once:
//
//   Add(request) ──> CoreScheduler ──Schedule()──> ScheduledStep ──> Executor::Run ──┐
//                    (running set, KV admission)    (batch, rows)    (the LLM pass)   │
//        done <──────CoreScheduler::Update() <── PassOutput (status, rows per member) ─┘
//                    (verify, commit, emit)
//
// The server's request queue (server/request_queue.h) feeds it from its worker thread; Generator
// (engine/generator.h) runs one sequence on it, so both run the very same steps. Admission,
// exactness and failure isolation: see engine/core_scheduler.h.
//
// Thread safety: one thread at a time (the owner of the runner and the KV cache).
#pragma once

#include <cstdint>
#include <utility>

#include "backend/backend.h"
#include "engine/core_scheduler.h"
#include "engine/executor.h"
#include "kv/kv_cache.h"

namespace specinfer {

class EngineCore {
 public:
  using DoneCallback = CoreScheduler::DoneCallback;
  using CancelPoll = CoreScheduler::CancelPoll;
  using Admission = CoreScheduler::Admission;

  // `runner` and `kv` must outlive the engine core.
  EngineCore(ModelRunner& runner, KvCacheManager& kv, BatchOptions options)
      : executor_(runner, kv), scheduler_(runner, kv, options) {}
  ~EngineCore() = default;  // the scheduler ends the running sequences as kCancelled

  // Starts a sequence if it fits now; see CoreScheduler::Add.
  StatusOr<Admission> Add(GenerateRequest request, TokenCallback on_token, DoneCallback on_done,
                          CancelPoll cancelled = nullptr) {
    return scheduler_.Add(std::move(request), std::move(on_token), std::move(on_done),
                          std::move(cancelled));
  }

  // One iteration: one LLM pass for every running sequence that has work. Does nothing when
  // none is running. Sequences that end are reported through their DoneCallback, in this call.
  void Step();

  // Ends every running sequence as kCancelled (Shutdown), reporting each.
  void CancelAll() { scheduler_.CancelAll(); }

  int32_t num_running() const { return scheduler_.num_running(); }
  bool idle() const { return scheduler_.idle(); }
  // KV blocks the running sequences may claim at their largest.
  int64_t reserved_kv_blocks() const { return scheduler_.reserved_kv_blocks(); }
  const BatchOptions& options() const { return scheduler_.options(); }
  // The adaptive speculation controller (engine/spec_controller.h): its figures for /metrics.
  const SpecController& spec_controller() const { return scheduler_.spec_controller(); }

 private:
  Executor executor_;        // declared first: the scheduler's sequences go before it
  CoreScheduler scheduler_;
};

}  // namespace specinfer
