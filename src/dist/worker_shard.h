// What an LLM worker (dist/llm_worker.h) runs: one TP x PP share of the model together with the
// collective group that connects it to its peers, behind one interface, so that the worker's
// service code is the same on CPUs and GPUs. Backends are chosen by name (LlmWorkerOptions::
// backend) from a registry that lives here, in the layer that owns the interface:
//   - "cpu" (always): backend/cpu/shard_runner.h over Gloo (dist/collective.h);
//   - "cuda" (registered by programs built with the CUDA backend, dist/cuda/cuda_worker_shard.h):
//     backend/cuda/cuda_runner.h's share over NCCL, its unique ids exchanged through the same
//     rendezvous store as Gloo's addresses.
//
// Thread safety: a WorkerShard is used by one thread at a time (the worker serialises its calls);
// the registry is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "backend/collective.h"
#include "backend/cpu/shard_runner.h"
#include "model/model.h"
#include "specinfer/status.h"

namespace gloo::rendezvous {
class Store;
}

namespace specinfer {

class WorkerShard {
 public:
  virtual ~WorkerShard() = default;

  virtual const Model& model() const = 0;
  virtual ShardRange layers() const = 0;
  virtual ShardRange vocab() const = 0;  // logits columns (last stage)
  virtual bool last_stage() const = 0;
  virtual int32_t num_kv_blocks() const = 0;
  virtual int32_t kv_block_size() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu", "cuda:1"

  // Forms this share's group for `epoch` through `store` (the peers reach this worker at `host`
  // where the transport needs it), dropping any earlier group first. Bounded by `timeout`, which
  // also bounds every later wait of the group.
  virtual Status Join(gloo::rendezvous::Store& store, const std::string& host, uint64_t epoch,
                      std::chrono::milliseconds timeout) = 0;
  // Drops the group (peers waiting on this worker see an error).
  virtual void Leave() = 0;
  virtual bool in_group() const = 0;

  // One pass (CpuShardRunner::Forward's contract: validated batch and tables; on the last stage
  // `logits` holds [logit_rows, vocab().count] and `argmax` [argmax_rows] each argmax row's
  // largest logit over vocab() and its token id; where returns_distributions(), `dists` the
  // distribution rows, required with them). An ABORTED error means the group is broken.
  virtual Status Forward(const ForwardBatch& batch,
                         std::span<const std::span<const int32_t>> tables, std::span<float> logits,
                         std::span<ArgmaxShare> argmax, DistRows* dists = nullptr) = 0;
  // Whether this last-stage share computes distribution rows (ForwardBatch::dist_rows) where its
  // logits are (every rank of the stage gathers those rows whole; tp rank 0 answers them), so
  // that only what each keeps crosses the network. Shares that do not refuse batches with them.
  virtual bool returns_distributions() const { return false; }
  // ModelRunner::warmup_passes of this share (what the manager's cost calibration needs).
  virtual int32_t warmup_passes() const { return 0; }
  virtual Status MoveKv(std::span<const int32_t> table, std::span<const int32_t> src,
                        std::span<const int32_t> dst) = 0;
  // Seconds spent in collectives since the last call.
  virtual double TakeCollectiveSeconds() = 0;
};

struct WorkerShardOptions {
  int32_t num_threads = 0;  // CPU threads (0: all)
  int32_t num_kv_blocks = 0;
  int32_t kv_block_size = 16;
  int32_t device = 0;  // GPU backends: which device
  bool cuda_graphs = true;  // GPU backends: CUDA graphs for batch-invariant passes
};

using WorkerShardFactory = std::function<StatusOr<std::unique_ptr<WorkerShard>>(
    std::shared_ptr<const Model> model, const CollectiveLayout& layout,
    const WorkerShardOptions& options)>;

// Registers (or replaces) a backend's factory.
void RegisterWorkerShardBackend(const std::string& name, WorkerShardFactory factory);
// Creates a share on backend `name`; NotFound (listing the registered ones) if there is none.
StatusOr<std::unique_ptr<WorkerShard>> CreateWorkerShard(const std::string& name,
                                                         std::shared_ptr<const Model> model,
                                                         const CollectiveLayout& layout,
                                                         const WorkerShardOptions& options);

}  // namespace specinfer
