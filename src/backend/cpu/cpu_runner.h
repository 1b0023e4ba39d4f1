// The CPU backend: runs a Llama-family model on the host, multi-threaded, with the KV cache in
// host memory. It is the fallback for machines without a GPU and the reference every CUDA
// kernel is checked against.
//
// Thread safety: one Forward/MoveKv at a time (the engine's step loop); the runner uses its own
// thread pool inside.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "common/thread_pool.h"

namespace specinfer {

struct CpuRunnerOptions {
  int32_t num_threads = 0;    // 0: all hardware threads
  int32_t num_kv_blocks = 0;  // KV storage, in blocks of kv_block_size positions
  int32_t kv_block_size = 16;
  // Threads to run on, shared with other runners that take turns with this one (an LLM and its
  // draft models); null: a pool of num_threads of its own.
  std::shared_ptr<ThreadPool> pool;
};

class CpuModelRunner final : public ModelRunner {
 public:
  // Checks that every weight type is supported and allocates the KV storage
  // (ResourceExhausted if it cannot be allocated).
  static StatusOr<std::unique_ptr<CpuModelRunner>> Create(std::shared_ptr<const Model> model,
                                                          const CpuRunnerOptions& options);

  const Model& model() const override { return *model_; }
  std::string name() const override { return "cpu"; }
  Status Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                 std::span<float> logits) override;
  Status MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                std::span<const int32_t> dst) override;
  int32_t num_kv_blocks() const override { return num_kv_blocks_; }
  int32_t kv_block_size() const override { return kv_block_size_; }
  int32_t num_threads() const { return pool_->num_threads(); }
  const std::shared_ptr<ThreadPool>& pool() const { return pool_; }

 private:
  CpuModelRunner(std::shared_ptr<const Model> model, const CpuRunnerOptions& options);

  // Attention for every token of the batch in layer `layer`: q [n, q_dim] -> out [n, q_dim].
  void Attention(const ForwardBatch& batch, const KvCacheManager& kv, int32_t layer,
                 const float* q, float* out);
  float* KeyAt(int32_t layer, int64_t slot) {
    return k_cache_.data() + (static_cast<size_t>(layer) * kv_slots_ + slot) * kv_dim_;
  }
  float* ValueAt(int32_t layer, int64_t slot) {
    return v_cache_.data() + (static_cast<size_t>(layer) * kv_slots_ + slot) * kv_dim_;
  }

  std::shared_ptr<const Model> model_;
  std::shared_ptr<ThreadPool> pool_;
  cpu::RopeTable rope_;
  int32_t num_kv_blocks_;
  int32_t kv_block_size_;
  int64_t kv_slots_;   // num_kv_blocks * block_size
  int32_t kv_dim_;
  std::vector<float> k_cache_;  // [layer, slot, kv_dim]
  std::vector<float> v_cache_;  // [layer, slot, kv_dim]

  // Activation buffers, grown to the largest batch seen.
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_, final_;
  std::vector<uint8_t> act_scratch_;
};

}  // namespace specinfer
