// Moved here from the LLM worker's service (dist/llm_worker.cc) so that the checks can be tested
// and fuzzed without a running worker.
#include "dist/llm_wire.h"

#include <string>

namespace specinfer {

namespace {

namespace pb = ::specinfer::worker;

// Bounds on what one request may ask for, whatever the worker's capacity.
constexpr int64_t kMaxBatchTokens = 1 << 16;
constexpr int64_t kMaxPosition = 1 << 24;
constexpr int64_t kMaxMoves = 1 << 16;
constexpr int64_t kMaxLogitsBytes = int64_t{1} << 30;  // one response's logits

// Checks a block table sent over the wire against this worker's capacity and the positions it
// must cover (backend/forward_check.h).
Status CheckWireTable(const google::protobuf::RepeatedField<int32_t>& table, int64_t covers,
                      const LlmWireLimits& limits, const std::string& what) {
  return CheckBlockTable(std::span<const int32_t>(table.data(), static_cast<size_t>(table.size())),
                         covers, limits.forward, what);
}

}  // namespace

Status ParseForwardRequest(const pb::LlmForwardRequest& req, const LlmWireLimits& limits,
                           ForwardBatch& batch, std::vector<TreeMask>& masks,
                           std::vector<std::span<const int32_t>>& tables) {
  const int32_t bs = limits.forward.kv_block_size;
  if (req.kv_block_size() != bs)
    return InvalidArgumentError("KV block size " + std::to_string(req.kv_block_size()) +
                                " differs from the worker's " + std::to_string(bs));
  const int64_t n = req.tokens_size();
  if (n > kMaxBatchTokens) return InvalidArgumentError("batch has too many tokens");
  if (req.positions_size() != n)
    return InvalidArgumentError("positions and tokens differ in length");
  if (req.seqs_size() > n) return InvalidArgumentError("more sequences than tokens");
  if (req.logit_rows_size() > n) return InvalidArgumentError("more logits rows than tokens");
  if (req.argmax_rows_size() > n) return InvalidArgumentError("more argmax rows than tokens");
  if (req.dist_rows_size() > n) return InvalidArgumentError("more distribution rows than tokens");
  if (req.dist_settings_size() != req.dist_rows_size())
    return InvalidArgumentError("distribution rows and their settings differ in number");
  if (limits.last_stage &&
      int64_t{req.dist_rows_size()} * limits.forward.vocab_size * 4 > kMaxLogitsBytes)
    return InvalidArgumentError("distributions of " + std::to_string(req.dist_rows_size()) +
                                " rows may exceed one response's limit");
  if (limits.last_stage &&
      int64_t{req.logit_rows_size()} * limits.logits_vocab * 4 > kMaxLogitsBytes)
    return InvalidArgumentError("logits of " + std::to_string(req.logit_rows_size()) +
                                " rows exceed one response's limit");
  for (int32_t p : req.positions())
    if (p < 0 || p >= kMaxPosition)
      return InvalidArgumentError("position " + std::to_string(p) + " out of range");
  batch.tokens.assign(req.tokens().begin(), req.tokens().end());
  batch.positions.assign(req.positions().begin(), req.positions().end());
  batch.logit_rows.assign(req.logit_rows().begin(), req.logit_rows().end());
  batch.argmax_rows.assign(req.argmax_rows().begin(), req.argmax_rows().end());
  for (int i = 0; i < req.dist_rows_size(); ++i) {
    const pb::LlmSampling& d = req.dist_settings(i);
    batch.AddDistRow(req.dist_rows(i), TokenDraw{d.temperature(), d.top_k(), d.top_p(), 0.0});
  }
  batch.batch_invariant = req.batch_invariant();
  masks.reserve(req.seqs_size());  // stable addresses for BatchSequence::mask
  for (int i = 0; i < req.seqs_size(); ++i) {
    const pb::LlmSequence& s = req.seqs(i);
    const std::string what = "sequence " + std::to_string(s.seq());
    if (s.token_count() <= 0 || s.token_begin() < 0 || s.kv_prefix() < 0 || s.masked_kv() < 0)
      return InvalidArgumentError(what + ": negative or empty ranges");
    const int64_t kv_end = int64_t{s.kv_prefix()} + s.masked_kv() + s.token_count();
    SI_RETURN_IF_ERROR(CheckWireTable(s.block_table(), kv_end, limits, what));
    BatchSequence b;
    b.seq = s.seq();
    b.token_begin = s.token_begin();
    b.token_count = s.token_count();
    b.kv_prefix = s.kv_prefix();
    b.masked_kv = s.masked_kv();
    if (s.has_mask()) {
      if (s.mask_cols() != int64_t{s.masked_kv()} + s.token_count())
        return InvalidArgumentError(what + ": mask has " + std::to_string(s.mask_cols()) +
                                    " columns, the sequence needs " +
                                    std::to_string(int64_t{s.masked_kv()} + s.token_count()));
      TreeMask m = TreeMask::Empty(0, s.mask_cols());
      m.num_tokens = s.token_count();
      if (s.mask_bits_size() != int64_t{m.num_tokens} * m.words_per_row)
        return InvalidArgumentError(what + ": mask bits do not match its rows and columns");
      m.bits.assign(s.mask_bits().begin(), s.mask_bits().end());
      masks.push_back(std::move(m));
      b.mask = &masks.back();
    }
    batch.seqs.push_back(b);
    tables.emplace_back(s.block_table().data(), static_cast<size_t>(s.block_table_size()));
  }
  return batch.Validate(limits.forward.vocab_size);
}

Status CheckMoveKvRequest(const pb::LlmMoveKvRequest& req, const LlmWireLimits& limits) {
  const int32_t bs = limits.forward.kv_block_size;
  if (req.kv_block_size() != bs) return InvalidArgumentError("MoveKv: KV block size differs");
  if (req.src_size() != req.dst_size())
    return InvalidArgumentError("MoveKv: src and dst differ in size");
  if (req.src_size() > kMaxMoves) return InvalidArgumentError("MoveKv: too many moves");
  if (req.length() < 0) return InvalidArgumentError("MoveKv: negative length");
  SI_RETURN_IF_ERROR(CheckWireTable(req.block_table(), req.length(), limits, "MoveKv"));
  for (int i = 0; i < req.src_size(); ++i)
    if (req.src(i) < 0 || req.src(i) >= req.length() || req.dst(i) < 0 ||
        req.dst(i) >= req.length())
      return InvalidArgumentError("MoveKv: position out of range");
  return Status::Ok();
}

}  // namespace specinfer
