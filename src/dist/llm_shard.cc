#include "dist/llm_shard.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <thread>

#include "backend/cpu/matmul.h"

namespace specinfer {

namespace {

WeightMatrix Rows(const WeightMatrix& w, ShardRange r) {
  WeightMatrix v = w;
  v.rows = r.count;
  v.data = w.row(r.begin);
  return v;
}

WeightVector Slice(const WeightVector& v, ShardRange r) {
  if (v.data == nullptr) return v;
  return WeightVector{v.data + r.begin, r.count};
}

void AddBias(float* y, const WeightVector& b, int64_t n, int64_t dim) {
  if (b.data == nullptr) return;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += b.data[i];
}

Status CheckType(const WeightMatrix& m, const char* what) {
  if (m.empty()) return InvalidArgumentError(std::string("model is missing weight ") + what);
  if (!cpu::SupportsType(m.type))
    return UnimplementedError(std::string("the CPU backend cannot use ") +
                              std::string(DTypeName(m.type)) + " weights (" + what + ")");
  return Status::Ok();
}

void Grow(std::vector<float>& v, size_t size) {
  if (v.size() < size) v.resize(size);
}

}  // namespace

ShardRange SplitEvenly(int64_t total, int32_t parts, int32_t index) {
  const int64_t base = total / parts, extra = total % parts;
  ShardRange r;
  r.begin = index * base + std::min<int64_t>(index, extra);
  r.count = base + (index < extra ? 1 : 0);
  return r;
}

Status CheckShardable(const ModelConfig& c, const CollectiveLayout& l) {
  if (l.num_stages < 1 || l.tp_size < 1 || l.stage < 0 || l.stage >= l.num_stages ||
      l.tp_rank < 0 || l.tp_rank >= l.tp_size)
    return InvalidArgumentError("stage/tp rank outside the group layout");
  if (l.num_stages > c.n_layers)
    return InvalidArgumentError("cannot split " + std::to_string(c.n_layers) + " layers over " +
                                std::to_string(l.num_stages) + " pipeline stages");
  if (c.n_kv_heads % l.tp_size != 0)
    return InvalidArgumentError("tensor parallelism " + std::to_string(l.tp_size) +
                                " does not divide the model's " + std::to_string(c.n_kv_heads) +
                                " KV heads");
  if (c.dim < l.tp_size || c.hidden_dim < l.tp_size || c.vocab_size < l.tp_size)
    return InvalidArgumentError("model too small for this tensor parallelism");
  return Status::Ok();
}

StatusOr<std::unique_ptr<CpuShardRunner>> CpuShardRunner::Create(
    std::shared_ptr<const Model> model, const CollectiveLayout& layout, int32_t num_kv_blocks,
    int32_t kv_block_size, int32_t num_threads) {
  const ModelConfig& c = model->config();
  SI_RETURN_IF_ERROR(CheckShardable(c, layout));
  if (num_kv_blocks <= 0 || kv_block_size <= 0)
    return InvalidArgumentError("KV cache needs a positive number and size of blocks");
  std::unique_ptr<CpuShardRunner> r(new CpuShardRunner());
  r->model_ = model;
  r->layout_ = layout;
  r->pool_ = std::make_shared<ThreadPool>(
      num_threads > 0 ? num_threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  r->rope_ = cpu::RopeTable(RopeInvFrequencies(c), std::min(c.max_seq_len, 1 << 16));
  r->layers_ = SplitEvenly(c.n_layers, layout.num_stages, layout.stage);
  r->vocab_ = SplitEvenly(c.vocab_size, layout.tp_size, layout.tp_rank);
  const int32_t T = layout.tp_size;
  for (int32_t i = 0; i < T; ++i) {
    ShardRange kvh = SplitEvenly(c.n_kv_heads, T, i);
    ShardRange h = SplitEvenly(c.n_heads, T, i);  // = kvh * group: T divides n_kv_heads
    r->kv_heads_.push_back(kvh);
    r->heads_.push_back(h);
    r->q_cols_.push_back({h.begin * c.head_dim, h.count * c.head_dim});
    r->dim_rows_.push_back(SplitEvenly(c.dim, T, i));
    r->hidden_rows_.push_back(SplitEvenly(c.hidden_dim, T, i));
  }
  const int32_t me = layout.tp_rank;
  const ShardRange kv_cols{r->kv_heads_[me].begin * c.head_dim,
                           r->kv_heads_[me].count * c.head_dim};
  const ModelWeights& w = model->weights();
  if (layout.stage == 0) SI_RETURN_IF_ERROR(CheckType(w.token_embedding, "token_embedding"));
  if (r->last_stage()) {
    SI_RETURN_IF_ERROR(CheckType(w.output, "output"));
    r->output_ = Rows(w.output, r->vocab_);
  }
  for (int64_t li = r->layers_.begin; li < r->layers_.end(); ++li) {
    const LayerWeights& l = w.layers[li];
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_down, &l.w_up})
      SI_RETURN_IF_ERROR(CheckType(*m, "layer weight").WithContext("layer " + std::to_string(li)));
    LayerShard s;
    s.wq = Rows(l.wq, r->q_cols_[me]);
    s.wk = Rows(l.wk, kv_cols);
    s.wv = Rows(l.wv, kv_cols);
    s.wo = Rows(l.wo, r->dim_rows_[me]);
    s.w_gate = Rows(l.w_gate, r->hidden_rows_[me]);
    s.w_up = Rows(l.w_up, r->hidden_rows_[me]);
    s.w_down = Rows(l.w_down, r->dim_rows_[me]);
    s.bq = Slice(l.bq, r->q_cols_[me]);
    s.bk = Slice(l.bk, kv_cols);
    s.bv = Slice(l.bv, kv_cols);
    r->shards_.push_back(s);
  }
  r->num_kv_blocks_ = num_kv_blocks;
  r->kv_block_size_ = kv_block_size;
  r->kv_slots_ = static_cast<int64_t>(num_kv_blocks) * kv_block_size;
  r->kv_dim_ = static_cast<int32_t>(kv_cols.count);
  const size_t per_cache = static_cast<size_t>(r->layers_.count) * r->kv_slots_ * r->kv_dim_;
  try {
    r->k_cache_.assign(per_cache, 0.0f);
    r->v_cache_.assign(per_cache, 0.0f);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(2 * per_cache * 4 >> 20) +
                                  " MiB of KV cache");
  }
  return r;
}

Status CpuShardRunner::Gather(CollectiveGroup* group, const float* local, int64_t n,
                              std::span<const ShardRange> shares, float* full) {
  const int64_t total = shares.back().end();
  if (layout_.tp_size == 1) {
    std::copy_n(local, n * total, full);
    return Status::Ok();
  }
  std::vector<size_t> counts;
  int64_t all = 0;
  for (const ShardRange& s : shares) {
    counts.push_back(static_cast<size_t>(n * s.count));
    all += n * s.count;
  }
  Grow(gathered_, static_cast<size_t>(all));
  SI_RETURN_IF_ERROR(group->AllGather(local, gathered_.data(), counts));
  // [rank][n][share] -> [n][total]
  int64_t off = 0;
  for (const ShardRange& s : shares) {
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(&gathered_[off + t * s.count], s.count, &full[t * total + s.begin]);
    off += n * s.count;
  }
  return Status::Ok();
}

Status CpuShardRunner::Forward(const ForwardBatch& batch,
                               std::span<const std::span<const int32_t>> tables,
                               CollectiveGroup* group, std::vector<float>* logits) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  if (tables.size() != batch.seqs.size()) return InternalError("one block table per sequence");
  if (group == nullptr && (layout_.tp_size > 1 || layout_.num_stages > 1))
    return FailedPreconditionError("not in a group");
  logits->clear();
  const int64_t n = batch.size();
  const int64_t m = static_cast<int64_t>(batch.logit_rows.size());
  if (n == 0) return Status::Ok();
  const int32_t me = layout_.tp_rank;
  const int64_t dim = c.dim, q_dim = c.q_dim(), hidden = c.hidden_dim;
  const int64_t qd = q_cols_[me].count, kvd = kv_dim_, hid = hidden_rows_[me].count;
  const int64_t dim_loc = dim_rows_[me].count;
  const int32_t hq = static_cast<int32_t>(heads_[me].count);
  const int32_t hk = static_cast<int32_t>(kv_heads_[me].count);
  Grow(x_, n * dim);
  Grow(xb_, n * dim);
  Grow(q_, n * qd);
  Grow(k_, n * kvd);
  Grow(v_, n * kvd);
  Grow(att_, n * qd);
  Grow(att_full_, n * q_dim);
  Grow(part_, n * dim_loc);
  Grow(gate_, n * hid);
  Grow(up_, n * hid);
  Grow(ffn_full_, n * hidden);
  const bool inv = batch.batch_invariant;

  if (layout_.stage == 0) {
    pool_->ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) cpu::GetRow(w.token_embedding, batch.tokens[t], &x_[t * dim]);
    }, 1);
  } else {
    SI_RETURN_IF_ERROR(group->RecvFromPrevStage(x_.data(), n * dim));
  }

  for (int32_t ll = 0; ll < layers_.count; ++ll) {
    const LayerWeights& l = w.layers[layers_.begin + ll];
    const LayerShard& s = shards_[ll];
    // --- attention block: this rank's heads ---
    for (int64_t t = 0; t < n; ++t)
      cpu::RmsNorm(&x_[t * dim], l.attn_norm.data, &xb_[t * dim], dim, c.norm_eps);
    const cpu::MatMulTarget qkv[] = {{&s.wq, q_.data()}, {&s.wk, k_.data()}, {&s.wv, v_.data()}};
    cpu::MatMulShared(qkv, xb_.data(), n, *pool_, act_scratch_, inv);
    AddBias(q_.data(), s.bq, n, qd);
    AddBias(k_.data(), s.bk, n, kvd);
    AddBias(v_.data(), s.bv, n, kvd);
    for (size_t si = 0; si < batch.seqs.size(); ++si) {
      const BatchSequence& bs = batch.seqs[si];
      for (int32_t i = 0; i < bs.token_count; ++i) {
        const int64_t t = bs.token_begin + i;
        rope_.Apply(&q_[t * qd], hq, batch.positions[t], c.rope_style);
        rope_.Apply(&k_[t * kvd], hk, batch.positions[t], c.rope_style);
        const int32_t p = bs.kv_prefix + bs.masked_kv + i;
        const int64_t slot =
            static_cast<int64_t>(tables[si][p / kv_block_size_]) * kv_block_size_ +
            p % kv_block_size_;
        std::copy_n(&k_[t * kvd], kvd, KeyAt(ll, slot));
        std::copy_n(&v_[t * kvd], kvd, ValueAt(ll, slot));
      }
    }
    Attention(batch, tables, ll, q_.data(), att_.data());
    SI_RETURN_IF_ERROR(Gather(group, att_.data(), n, q_cols_, att_full_.data()));
    cpu::MatMul(s.wo, att_full_.data(), n, part_.data(), *pool_, act_scratch_, inv);
    SI_RETURN_IF_ERROR(Gather(group, part_.data(), n, dim_rows_, xb_.data()));
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += xb_[i];

    // --- feed-forward block: this rank's hidden units ---
    for (int64_t t = 0; t < n; ++t)
      cpu::RmsNorm(&x_[t * dim], l.ffn_norm.data, &xb_[t * dim], dim, c.norm_eps);
    const cpu::MatMulTarget gate_up[] = {{&s.w_gate, gate_.data()}, {&s.w_up, up_.data()}};
    cpu::MatMulShared(gate_up, xb_.data(), n, *pool_, act_scratch_, inv);
    cpu::SwiGlu(gate_.data(), up_.data(), n * hid);
    SI_RETURN_IF_ERROR(Gather(group, gate_.data(), n, hidden_rows_, ffn_full_.data()));
    cpu::MatMul(s.w_down, ffn_full_.data(), n, part_.data(), *pool_, act_scratch_, inv);
    SI_RETURN_IF_ERROR(Gather(group, part_.data(), n, dim_rows_, xb_.data()));
    for (int64_t i = 0; i < n * dim; ++i) x_[i] += xb_[i];
  }

  if (!last_stage()) return group->SendToNextStage(x_.data(), n * dim);
  // Final norm and this rank's vocabulary rows, for the rows whose logits are wanted.
  logits->assign(static_cast<size_t>(m * vocab_.count), 0.0f);
  if (m > 0) {
    Grow(final_, m * dim);
    for (int64_t i = 0; i < m; ++i)
      cpu::RmsNorm(&x_[batch.logit_rows[i] * dim], w.final_norm.data, &final_[i * dim], dim,
                   c.norm_eps);
    cpu::MatMul(output_, final_.data(), m, logits->data(), *pool_, act_scratch_, inv);
  }
  return Status::Ok();
}

void CpuShardRunner::Attention(const ForwardBatch& batch,
                               std::span<const std::span<const int32_t>> tables,
                               int32_t local_layer, const float* q, float* out) {
  // The same arithmetic as CpuModelRunner::Attention, over this rank's KV heads only.
  const ModelConfig& c = model_->config();
  const int32_t head_dim = c.head_dim;
  const int32_t group = c.n_heads / c.n_kv_heads;
  const int32_t hk = static_cast<int32_t>(kv_heads_[layout_.tp_rank].count);
  const int64_t qd = q_cols_[layout_.tp_rank].count;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int32_t bs = kv_block_size_;

  struct Item {
    int32_t seq;  // index into batch.seqs
    int32_t i;    // token index within the sequence
  };
  std::vector<Item> items;
  items.reserve(batch.size());
  for (size_t si = 0; si < batch.seqs.size(); ++si)
    for (int32_t i = 0; i < batch.seqs[si].token_count; ++i)
      items.push_back({static_cast<int32_t>(si), i});
  const int64_t work = static_cast<int64_t>(items.size()) * hk;
  const int64_t keys = batch.seqs.front().kv_end();
  const int64_t item_work = std::max<int64_t>(1, keys * head_dim * group * 2);
  const int64_t grain = std::max<int64_t>(
      std::max<int64_t>(1, (int64_t{1} << 15) / item_work), work / (4 * pool_->num_threads()));

  pool_->ParallelFor(work, [&](int64_t wb, int64_t we) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int32_t> visible;
    for (int64_t wi = wb; wi < we; ++wi) {
      const Item& it = items[wi / hk];
      const int32_t kvh = static_cast<int32_t>(wi % hk);  // local KV head
      const BatchSequence& s = batch.seqs[it.seq];
      const std::span<const int32_t> table = tables[it.seq];
      const int64_t t = s.token_begin + it.i;
      const int64_t head0 = static_cast<int64_t>(kvh) * group * head_dim;
      cpu::AttendKvHead(s, it.i, table, bs,
                        KeyAt(local_layer, 0) + static_cast<int64_t>(kvh) * head_dim,
                        ValueAt(local_layer, 0) + static_cast<int64_t>(kvh) * head_dim, kv_dim_,
                        q + t * qd + head0, group, head_dim, scale, visible, scores,
                        out + t * qd + head0);
    }
  }, grain);
}

void CpuShardRunner::MoveKv(std::span<const int32_t> table, std::span<const int32_t> src,
                            std::span<const int32_t> dst) {
  const int32_t bs = kv_block_size_;
  auto slot_of = [&](int32_t p) { return static_cast<int64_t>(table[p / bs]) * bs + p % bs; };
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == dst[i]) continue;
    const int64_t from = slot_of(src[i]), to = slot_of(dst[i]);
    for (int32_t l = 0; l < layers_.count; ++l) {
      std::copy_n(KeyAt(l, from), kv_dim_, KeyAt(l, to));
      std::copy_n(ValueAt(l, from), kv_dim_, ValueAt(l, to));
    }
  }
}

}  // namespace specinfer
