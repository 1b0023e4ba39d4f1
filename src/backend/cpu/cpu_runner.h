// The CPU backend: runs a Llama-family model on the host, multi-threaded, with the KV cache in
// host memory. It is the fallback for machines without a GPU and the reference every CUDA
// kernel is checked against.
//
// The layer program is CpuShardRunner's (backend/cpu/shard_runner.h) with a 1 x 1 layout: this
// class only adapts it to the ModelRunner interface (block tables from the KvCacheManager,
// CheckForward) and adds nothing to the hot path.
//
// Thread safety: one Forward/MoveKv at a time (the engine's step loop); the runner uses its
// thread pool inside.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/shard_runner.h"
#include "common/thread_pool.h"

namespace specinfer {

class CpuModelRunner final : public ModelRunner {
 public:
  // Checks that every weight type is supported and allocates the KV storage
  // (ResourceExhausted if it cannot be allocated).
  static StatusOr<std::unique_ptr<CpuModelRunner>> Create(std::shared_ptr<const Model> model,
                                                          const CpuRunnerOptions& options);

  const Model& model() const override { return shard_->model(); }
  std::string name() const override { return "cpu"; }
  // Refuses (CheckForward) a KV manager whose block size is not options.kv_block_size.
  Status Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                 std::span<float> logits) override;
  Status MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                std::span<const int32_t> dst) override;
  int32_t num_kv_blocks() const override { return shard_->num_kv_blocks(); }
  int32_t kv_block_size() const override { return shard_->kv_block_size(); }
  int32_t num_threads() const { return shard_->pool()->num_threads(); }
  const std::shared_ptr<ThreadPool>& pool() const { return shard_->pool(); }

 private:
  explicit CpuModelRunner(std::unique_ptr<CpuShardRunner> shard) : shard_(std::move(shard)) {}

  std::unique_ptr<CpuShardRunner> shard_;  // the whole model: a 1 x 1 layout
  std::vector<std::span<const int32_t>> tables_;  // per pass: block tables of batch.seqs
};

}  // namespace specinfer
