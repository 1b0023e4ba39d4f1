#include "backend/forward_check.h"

#include <string>

namespace specinfer {

Status CheckForward(const ForwardBatch& batch, const KvCacheManager& kv,
                    const ForwardLimits& limits, size_t logits_size, size_t argmax_size,
                    bool dists) {
  SI_RETURN_IF_ERROR(batch.Validate(limits.vocab_size));
  if (logits_size < batch.logit_rows.size() * static_cast<size_t>(limits.vocab_size))
    return InvalidArgumentError("logits buffer too small");
  if (argmax_size < batch.argmax_rows.size())
    return InvalidArgumentError(argmax_size == 0 ? "a batch with argmax rows needs ForwardArgmax"
                                                 : "argmax buffer too small");
  if (!batch.dist_rows.empty() && !dists)
    return InvalidArgumentError(
        "a batch with distribution rows needs ForwardArgmax of a runner "
        "that returns distributions");
  if (kv.block_size() != limits.kv_block_size)
    return InvalidArgumentError("KV cache block size " + std::to_string(kv.block_size()) +
                                " differs from the runner's " +
                                std::to_string(limits.kv_block_size));
  for (const BatchSequence& s : batch.seqs) {
    if (!kv.HasSequence(s.seq)) return InvalidArgumentError("batch names an unknown sequence");
    if (kv.Length(s.seq) < s.kv_end())
      return FailedPreconditionError("KV slots not reserved for the batch");
    Status table = CheckBlockTable(kv.BlockTable(s.seq), s.kv_end(), limits, "KV manager");
    if (!table.ok()) return InternalError(table.message() + " (this runner's storage)");
  }
  return Status::Ok();
}

Status CheckBlockTable(std::span<const int32_t> table, int64_t covers,
                       const ForwardLimits& limits, std::string_view what) {
  const std::string w(what);
  if (table.size() > static_cast<size_t>(limits.num_kv_blocks))
    return InvalidArgumentError(w + ": block table longer than the KV capacity");
  for (int32_t b : table)
    if (b < 0 || b >= limits.num_kv_blocks)
      return InvalidArgumentError(w + ": KV block " + std::to_string(b) + " outside [0, " +
                                  std::to_string(limits.num_kv_blocks) + ")");
  if (covers > static_cast<int64_t>(table.size()) * limits.kv_block_size)
    return InvalidArgumentError(w + ": block table does not cover its " +
                                std::to_string(covers) + " positions");
  return Status::Ok();
}

Status CheckMoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                   std::span<const int32_t> dst) {
  if (src.size() != dst.size()) return InvalidArgumentError("MoveKv: src and dst differ in size");
  if (!kv.HasSequence(seq)) return InvalidArgumentError("MoveKv: unknown sequence");
  const int32_t len = kv.Length(seq);
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] < 0 || src[i] >= len || dst[i] < 0 || dst[i] >= len)
      return InvalidArgumentError("MoveKv: position out of range");
  return Status::Ok();
}

}  // namespace specinfer
