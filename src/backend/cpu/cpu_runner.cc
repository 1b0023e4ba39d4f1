#include "backend/cpu/cpu_runner.h"

#include "backend/forward_check.h"

namespace specinfer {

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    std::shared_ptr<const Model> model, const CpuRunnerOptions& options) {
  SI_ASSIGN_OR_RETURN(std::unique_ptr<CpuShardRunner> shard,
                      CpuShardRunner::Create(std::move(model), CollectiveLayout{}, options));
  return std::unique_ptr<CpuModelRunner>(new CpuModelRunner(std::move(shard)));
}

Status CpuModelRunner::Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                               std::span<float> logits) {
  const ForwardLimits limits{shard_->model().config().vocab_size, shard_->num_kv_blocks(),
                             shard_->kv_block_size()};
  SI_RETURN_IF_ERROR(CheckForward(batch, kv, limits, logits.size()));
  tables_.clear();
  for (const BatchSequence& s : batch.seqs) tables_.push_back(kv.BlockTable(s.seq));
  return shard_->Forward(batch, tables_, /*group=*/nullptr, logits);
}

Status CpuModelRunner::MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                              std::span<const int32_t> dst) {
  SI_RETURN_IF_ERROR(CheckMoveKv(kv, seq, src, dst));
  shard_->MoveKv(kv.BlockTable(seq), src, dst);
  return Status::Ok();
}

}  // namespace specinfer
