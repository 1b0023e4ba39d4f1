#include "backend/cpu/cpu_runner.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <thread>

#include "backend/cpu/matmul.h"

namespace specinfer {

namespace {

Status CheckType(const WeightMatrix& m, const char* what) {
  if (m.empty()) return InvalidArgumentError(std::string("model is missing weight ") + what);
  if (!cpu::SupportsType(m.type)) {
    return UnimplementedError(std::string("the CPU backend cannot use ") +
                              std::string(DTypeName(m.type)) + " weights (" + what + ")");
  }
  return Status::Ok();
}

void AddBias(float* y, const WeightVector& b, int64_t n, int64_t dim) {
  if (b.data == nullptr) return;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += b.data[i];
}

}  // namespace

CpuModelRunner::CpuModelRunner(std::shared_ptr<const Model> model,
                               const CpuRunnerOptions& options)
    : model_(std::move(model)),
      pool_(options.pool ? options.pool
                         : std::make_shared<ThreadPool>(
                               options.num_threads > 0
                                   ? options.num_threads
                                   : static_cast<int>(
                                         std::max(1u, std::thread::hardware_concurrency())))),
      num_kv_blocks_(options.num_kv_blocks),
      kv_block_size_(options.kv_block_size) {
  const ModelConfig& c = model_->config();
  rope_ = cpu::RopeTable(RopeInvFrequencies(c), std::min(c.max_seq_len, 1 << 16));
  kv_slots_ = static_cast<int64_t>(num_kv_blocks_) * kv_block_size_;
  kv_dim_ = c.kv_dim();
}

StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    std::shared_ptr<const Model> model, const CpuRunnerOptions& options) {
  if (options.num_kv_blocks <= 0 || options.kv_block_size <= 0)
    return InvalidArgumentError("KV cache needs a positive number and size of blocks");
  const ModelWeights& w = model->weights();
  SI_RETURN_IF_ERROR(CheckType(w.token_embedding, "token_embedding"));
  SI_RETURN_IF_ERROR(CheckType(w.output, "output"));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_down, &l.w_up})
      SI_RETURN_IF_ERROR(CheckType(*m, "layer weight").WithContext("layer " + std::to_string(i)));
  }
  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(std::move(model), options));
  const size_t per_cache =
      static_cast<size_t>(r->model_->config().n_layers) * r->kv_slots_ * r->kv_dim_;
  try {
    r->k_cache_.assign(per_cache, 0.0f);
    r->v_cache_.assign(per_cache, 0.0f);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(2 * per_cache * 4 >> 20) +
                                  " MiB of KV cache");
  }
  return r;
}

Status CpuModelRunner::Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                               std::span<float> logits) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  SI_RETURN_IF_ERROR(batch.Validate(c.vocab_size));
  const int64_t n = batch.size();
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  if (logits.size() < static_cast<size_t>(m * c.vocab_size))
    return InvalidArgumentError("logits buffer too small");
  for (const BatchSequence& s : batch.seqs) {
    if (!kv.HasSequence(s.seq)) return InvalidArgumentError("batch names an unknown sequence");
    if (kv.Length(s.seq) < s.kv_end())
      return FailedPreconditionError("KV slots not reserved for the batch");
    if (kv.BlockTable(s.seq).back() >= num_kv_blocks_)
      return InternalError("KV block outside this runner's storage");
  }
  if (n == 0) return Status::Ok();

  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  auto grow = [](std::vector<float>& v, size_t size) {
    if (v.size() < size) v.resize(size);
  };
  grow(x_, n * dim);
  grow(xb_, n * std::max(dim, q_dim));
  grow(q_, n * q_dim);
  grow(k_, n * kv_dim);
  grow(v_, n * kv_dim);
  grow(att_, n * q_dim);
  grow(gate_, n * hidden);
  grow(up_, n * hidden);

  const bool inv = batch.batch_invariant;
  // Token embeddings.
  pool_->ParallelFor(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) cpu::GetRow(w.token_embedding, batch.tokens[t], &x_[t * dim]);
  }, 1);

  for (int32_t layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& l = w.layers[layer];
    // --- attention block ---
    for (int64_t t = 0; t < n; ++t)
      cpu::RmsNorm(&x_[t * dim], l.attn_norm.data, &xb_[t * dim], dim, c.norm_eps);
    const cpu::MatMulTarget qkv[] = {{&l.wq, q_.data()}, {&l.wk, k_.data()}, {&l.wv, v_.data()}};
    cpu::MatMulShared(qkv, xb_.data(), n, *pool_, act_scratch_, inv);
    AddBias(q_.data(), l.bq, n, q_dim);
    AddBias(k_.data(), l.bk, n, kv_dim);
    AddBias(v_.data(), l.bv, n, kv_dim);
    for (const BatchSequence& s : batch.seqs) {
      for (int32_t i = 0; i < s.token_count; ++i) {
        const int64_t t = s.token_begin + i;
        rope_.Apply(&q_[t * q_dim], c.n_heads, batch.positions[t], c.rope_style);
        rope_.Apply(&k_[t * kv_dim], c.n_kv_heads, batch.positions[t], c.rope_style);
        const int64_t slot = kv.SlotOf(s.seq, s.kv_prefix + s.masked_kv + i);
        std::copy_n(&k_[t * kv_dim], kv_dim, KeyAt(layer, slot));
        std::copy_n(&v_[t * kv_dim], kv_dim, ValueAt(layer, slot));
      }
    }
    Attention(batch, kv, layer, q_.data(), att_.data());
    cpu::MatMul(l.wo, att_.data(), n, xb_.data(), *pool_, act_scratch_, inv);
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += xb_[i];

    // --- feed-forward block ---
    for (int64_t t = 0; t < n; ++t)
      cpu::RmsNorm(&x_[t * dim], l.ffn_norm.data, &xb_[t * dim], dim, c.norm_eps);
    const cpu::MatMulTarget gate_up[] = {{&l.w_gate, gate_.data()}, {&l.w_up, up_.data()}};
    cpu::MatMulShared(gate_up, xb_.data(), n, *pool_, act_scratch_, inv);
    cpu::SwiGlu(gate_.data(), up_.data(), n * hidden);
    cpu::MatMul(l.w_down, gate_.data(), n, xb_.data(), *pool_, act_scratch_, inv);
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += xb_[i];
  }

  // Final norm and classifier, only for the rows whose logits are wanted.
  if (m > 0) {
    grow(final_, m * dim);
    for (int64_t i = 0; i < m; ++i)
      cpu::RmsNorm(&x_[batch.logit_rows[i] * dim], w.final_norm.data, &final_[i * dim], dim,
                   c.norm_eps);
    cpu::MatMul(w.output, final_.data(), m, logits.data(), *pool_, act_scratch_, inv);
  }
  return Status::Ok();
}

void CpuModelRunner::Attention(const ForwardBatch& batch, const KvCacheManager& kv,
                               int32_t layer, const float* q, float* out) {
  const ModelConfig& c = model_->config();
  const int32_t head_dim = c.head_dim, q_dim = c.q_dim();
  const int32_t group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int32_t bs = kv_block_size_;

  // One work item per (sequence token, kv head): the `group` query heads that share a kv head
  // walk the same keys together.
  struct Item {
    const BatchSequence* seq;
    int32_t i;  // token index within the sequence
  };
  std::vector<Item> items;
  items.reserve(batch.size());
  for (const BatchSequence& s : batch.seqs)
    for (int32_t i = 0; i < s.token_count; ++i) items.push_back({&s, i});
  const int64_t work = static_cast<int64_t>(items.size()) * c.n_kv_heads;
  // Chunks of at least ~32K multiply-adds (keys x head_dim x group, twice).
  const int64_t keys = batch.seqs.front().kv_end();
  const int64_t item_work = std::max<int64_t>(1, keys * head_dim * group * 2);
  const int64_t grain = std::max<int64_t>(
      std::max<int64_t>(1, (int64_t{1} << 15) / item_work), work / (4 * pool_->num_threads()));

  pool_->ParallelFor(work, [&](int64_t wb, int64_t we) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int32_t> visible;
    for (int64_t wi = wb; wi < we; ++wi) {
      const Item& it = items[wi / c.n_kv_heads];
      const int32_t kvh = static_cast<int32_t>(wi % c.n_kv_heads);
      const BatchSequence& s = *it.seq;
      const int64_t t = s.token_begin + it.i;
      const int64_t head0 = static_cast<int64_t>(kvh) * group * head_dim;
      cpu::AttendKvHead(s, it.i, kv.BlockTable(s.seq), bs,
                        KeyAt(layer, 0) + static_cast<int64_t>(kvh) * head_dim,
                        ValueAt(layer, 0) + static_cast<int64_t>(kvh) * head_dim, kv_dim_,
                        q + t * q_dim + head0, group, head_dim, scale, visible, scores,
                        out + t * q_dim + head0);
    }
  }, grain);
}

Status CpuModelRunner::MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                              std::span<const int32_t> dst) {
  if (src.size() != dst.size()) return InvalidArgumentError("MoveKv: src and dst differ in size");
  if (!kv.HasSequence(seq)) return InvalidArgumentError("MoveKv: unknown sequence");
  const int32_t len = kv.Length(seq);
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] < 0 || src[i] >= len || dst[i] < 0 || dst[i] >= len)
      return InvalidArgumentError("MoveKv: position out of range");
  const int32_t layers = model_->config().n_layers;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == dst[i]) continue;
    const int64_t from = kv.SlotOf(seq, src[i]), to = kv.SlotOf(seq, dst[i]);
    for (int32_t l = 0; l < layers; ++l) {
      std::copy_n(KeyAt(l, from), kv_dim_, KeyAt(l, to));
      std::copy_n(ValueAt(l, from), kv_dim_, ValueAt(l, to));
    }
  }
  return Status::Ok();
}

}  // namespace specinfer
