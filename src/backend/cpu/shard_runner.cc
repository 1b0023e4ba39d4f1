#include "backend/cpu/shard_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <new>
#include <thread>

#include "backend/cpu/matmul.h"
#include "backend/llama_program.h"

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
    std::shared_ptr<const Model> model, const CollectiveLayout& layout,
    const CpuRunnerOptions& options) {
  const ModelConfig& c = model->config();
  const int32_t num_kv_blocks = options.num_kv_blocks, kv_block_size = options.kv_block_size;
  if (num_kv_blocks <= 0 || kv_block_size <= 0)
    return InvalidArgumentError("KV cache needs a positive number and size of blocks");
  SI_RETURN_IF_ERROR(CheckShardable(c, layout));
  std::unique_ptr<CpuShardRunner> r(new CpuShardRunner());
  r->model_ = model;
  r->layout_ = layout;
  r->pool_ = options.pool ? options.pool
                          : std::make_shared<ThreadPool>(
                                options.num_threads > 0
                                    ? options.num_threads
                                    : static_cast<int>(
                                          std::max(1u, std::thread::hardware_concurrency())));
  r->rope_ = cpu::RopeTable(RopeInvFrequencies(c), std::min(c.max_seq_len, 1 << 16));
  if (c.rope_theta_local != 0.0f)
    r->rope_local_ = cpu::RopeTable(RopeInvFrequenciesLocal(c), std::min(c.max_seq_len, 1 << 16));
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
    r->vocab_cols_.push_back(SplitEvenly(c.vocab_size, T, i));
  }
  const int32_t me = layout.tp_rank;
  const ShardRange kv_cols{r->kv_heads_[me].begin * c.head_dim,
                           r->kv_heads_[me].count * c.head_dim};
  const ModelWeights& w = model->weights();
  if (layout.stage == 0) SI_RETURN_IF_ERROR(CheckType(w.token_embedding, "token_embedding"));
  if (r->last_stage()) {
    SI_RETURN_IF_ERROR(CheckType(w.output, "output"));
    SI_ASSIGN_OR_RETURN(r->output_, cpu::CpuMatrix::Prepare(Rows(w.output, r->vocab_)));
  }
  for (int64_t li = r->layers_.begin; li < r->layers_.end(); ++li) {
    const LayerWeights& l = w.layers[li];
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_down, &l.w_up})
      SI_RETURN_IF_ERROR(CheckType(*m, "layer weight").WithContext("layer " + std::to_string(li)));
    if ((c.qk_norm && (l.q_norm.data == nullptr || l.k_norm.data == nullptr)) ||
        (c.post_norms && (l.post_attn_norm.data == nullptr || l.post_ffn_norm.data == nullptr)))
      return InvalidArgumentError("layer " + std::to_string(li) +
                                  " is missing its q/k norm or post-norm weights");
    LayerShard s;
    SI_ASSIGN_OR_RETURN(s.wq, cpu::CpuMatrix::Prepare(Rows(l.wq, r->q_cols_[me])));
    SI_ASSIGN_OR_RETURN(s.wk, cpu::CpuMatrix::Prepare(Rows(l.wk, kv_cols)));
    SI_ASSIGN_OR_RETURN(s.wv, cpu::CpuMatrix::Prepare(Rows(l.wv, kv_cols)));
    SI_ASSIGN_OR_RETURN(s.wo, cpu::CpuMatrix::Prepare(Rows(l.wo, r->dim_rows_[me])));
    SI_ASSIGN_OR_RETURN(s.w_gate, cpu::CpuMatrix::Prepare(Rows(l.w_gate, r->hidden_rows_[me])));
    SI_ASSIGN_OR_RETURN(s.w_up, cpu::CpuMatrix::Prepare(Rows(l.w_up, r->hidden_rows_[me])));
    SI_ASSIGN_OR_RETURN(s.w_down, cpu::CpuMatrix::Prepare(Rows(l.w_down, r->dim_rows_[me])));
    s.bq = Slice(l.bq, r->q_cols_[me]);
    s.bk = Slice(l.bk, kv_cols);
    s.bv = Slice(l.bv, kv_cols);
    r->shards_.push_back(std::move(s));
  }
  r->num_kv_blocks_ = num_kv_blocks;
  r->kv_block_size_ = kv_block_size;
  r->kv_slots_ = static_cast<int64_t>(num_kv_blocks) * kv_block_size;
  r->kv_dim_ = static_cast<int32_t>(kv_cols.count);
  const size_t per_cache = static_cast<size_t>(r->layers_.count) * r->kv_slots_ * r->kv_dim_;
  auto zeroed = [&] {
    return static_cast<float*>(std::calloc(std::max<size_t>(per_cache, 1), sizeof(float)));
  };
  r->k_cache_.reset(zeroed());
  r->v_cache_.reset(zeroed());
  if (!r->k_cache_ || !r->v_cache_) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(2 * per_cache * 4 >> 20) +
                                  " MiB of KV cache");
  }
  return r;
}

Status CpuShardRunner::Gather(Collective* group, const float* local, int64_t n,
                              std::span<const ShardRange> shares, float* full) {
  if (layout_.tp_size == 1) return Status::Ok();  // local is full
  const int64_t total = shares.back().end();
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

Status CpuShardRunner::GatherVocabRows(Collective* group, const float* local, int64_t n,
                                       float* full) {
  if (layout_.tp_size == 1) {
    std::copy_n(local, n * vocab_.count, full);
    return Status::Ok();
  }
  if (group == nullptr) return FailedPreconditionError("a TP share gathers rows in its group");
  return Gather(group, local, n, vocab_cols_, full);
}

// The operations of backend/llama_program.h on this share, for one batch. `layer` is a local
// layer index (KV storage); weights are those of layer layers_.begin + layer.
class CpuShardRunner::Pass {
 public:
  Pass(CpuShardRunner& r, const ForwardBatch& batch,
       std::span<const std::span<const int32_t>> tables, Collective* group,
       std::span<float> logits)
      : r_(r), c_(r.model_->config()), w_(r.model_->weights()), batch_(batch),
        group_(group), logits_(logits), n_(batch.size()), inv_(batch.batch_invariant) {
    const int32_t me = r.layout_.tp_rank;
    qd_ = r.q_cols_[me].count;
    kvd_ = r.kv_dim_;
    hid_ = r.hidden_rows_[me].count;
    hq_ = static_cast<int32_t>(r.heads_[me].count);
    hk_ = static_cast<int32_t>(r.kv_heads_[me].count);
    seq_of_.resize(static_cast<size_t>(n_));
    slot_begin_.resize(batch.seqs.size() + 1);
    for (size_t si = 0; si < batch.seqs.size(); ++si) {
      const BatchSequence& bs = batch.seqs[si];
      std::fill_n(seq_of_.begin() + bs.token_begin, bs.token_count, static_cast<int32_t>(si));
      slot_begin_[si + 1] = slot_begin_[si] + bs.kv_end();
    }
    // Every position's cache slot, once per pass (the same for every layer, head and token).
    const int32_t bsz = r.kv_block_size_;
    slots_.resize(static_cast<size_t>(slot_begin_.back()));
    for (size_t si = 0; si < batch.seqs.size(); ++si) {
      int32_t* out = slots_.data() + slot_begin_[si];
      const std::span<const int32_t> table = tables[si];
      for (int32_t p = 0; p < batch.seqs[si].kv_end(); ++p)
        out[p] = table[p / bsz] * bsz + p % bsz;
    }
    const int64_t dim = c_.dim;
    Grow(r.x_, n_ * dim);
    Grow(r.xb_, n_ * dim);
    Grow(r.q_, n_ * qd_);
    Grow(r.k_, n_ * kvd_);
    Grow(r.v_, n_ * kvd_);
    Grow(r.att_, n_ * qd_);
    Grow(r.gate_, n_ * hid_);
    Grow(r.up_, n_ * hid_);
    // With one TP rank, a step's local share is the full tensor: no gather, no copy.
    att_full_ = r.att_.data();
    part_ = r.xb_.data();
    ffn_full_ = r.gate_.data();
    if (r.layout_.tp_size > 1) {
      Grow(r.att_full_, n_ * c_.q_dim());
      Grow(r.part_, n_ * r.dim_rows_[me].count);
      Grow(r.ffn_full_, n_ * c_.hidden_dim);
      att_full_ = r.att_full_.data();
      part_ = r.part_.data();
      ffn_full_ = r.ffn_full_.data();
    }
  }

  Status Input() {
    if (r_.layout_.stage > 0) return group_->RecvFromPrevStage(r_.x_.data(), n_ * c_.dim);
    const int64_t dim = c_.dim;
    r_.pool_->ParallelFor(n_, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        cpu::GetRow(w_.token_embedding, batch_.tokens[t], &r_.x_[t * dim]);
    }, 1);
    if (c_.embedding_scale != 1.0f) {
      for (int64_t i = 0; i < n_ * dim; ++i) r_.x_[i] *= c_.embedding_scale;
    }
    return Status::Ok();
  }

  Status Norm(int32_t layer, LlamaNorm which) {
    const LayerWeights& l = w_.layers[r_.layers_.begin + layer];
    const float* gain = which == LlamaNorm::kAttention ? l.attn_norm.data : l.ffn_norm.data;
    const int64_t dim = c_.dim;
    ForEachToken(dim, [&](int64_t t) {
      cpu::RmsNorm(&r_.x_[t * dim], gain, &r_.xb_[t * dim], dim, c_.norm_eps);
    });
    return Status::Ok();
  }

  Status ProjectQkv(int32_t layer) {
    const LayerShard& s = r_.shards_[layer];
    const cpu::MatMulTarget qkv[] = {
        {&s.wq, r_.q_.data()}, {&s.wk, r_.k_.data()}, {&s.wv, r_.v_.data()}};
    cpu::MatMulShared(qkv, r_.xb_.data(), n_, *r_.pool_, r_.act_scratch_, inv_);
    AddBias(r_.q_.data(), s.bq, n_, qd_);
    AddBias(r_.k_.data(), s.bk, n_, kvd_);
    AddBias(r_.v_.data(), s.bv, n_, kvd_);
    if (c_.qk_norm) {
      // Per-head RMSNorm of q and k (Qwen3, Gemma 3), before RoPE.
      const LayerWeights& l = w_.layers[r_.layers_.begin + layer];
      const int32_t hd = c_.head_dim;
      ForEachToken(qd_ + kvd_, [&](int64_t t) {
        for (int32_t h = 0; h < hq_; ++h) {
          float* v = &r_.q_[t * qd_ + static_cast<int64_t>(h) * hd];
          cpu::RmsNorm(v, l.q_norm.data, v, hd, c_.norm_eps);
        }
        for (int32_t h = 0; h < hk_; ++h) {
          float* v = &r_.k_[t * kvd_ + static_cast<int64_t>(h) * hd];
          cpu::RmsNorm(v, l.k_norm.data, v, hd, c_.norm_eps);
        }
      });
    }
    return Status::Ok();
  }

  Status RopeAndStoreKv(int32_t layer) {
    const bool local = c_.rope_theta_local != 0.0f &&
                       c_.IsSlidingLayer(static_cast<int32_t>(r_.layers_.begin + layer));
    const cpu::RopeTable& rope = local ? r_.rope_local_ : r_.rope_;
    ForEachToken(qd_ + 2 * kvd_, [&](int64_t t) {
      const int32_t si = seq_of_[t];
      const BatchSequence& bs = batch_.seqs[si];
      rope.Apply(&r_.q_[t * qd_], hq_, batch_.positions[t], c_.rope_style);
      rope.Apply(&r_.k_[t * kvd_], hk_, batch_.positions[t], c_.rope_style);
      const int32_t p = bs.kv_prefix + bs.masked_kv + static_cast<int32_t>(t - bs.token_begin);
      const int64_t slot = slots_[slot_begin_[si] + p];
      std::copy_n(&r_.k_[t * kvd_], kvd_, r_.KeyAt(layer, slot));
      std::copy_n(&r_.v_[t * kvd_], kvd_, r_.ValueAt(layer, slot));
    });
    return Status::Ok();
  }

  // Attention of this rank's query heads over its KV heads: q [n, qd] -> att [n, qd].
  Status Attend(int32_t layer) {
    const int32_t head_dim = c_.head_dim;
    const int32_t group = c_.n_heads / c_.n_kv_heads;
    const float scale = c_.AttentionScale();
    const int32_t window =
        c_.IsSlidingLayer(static_cast<int32_t>(r_.layers_.begin + layer)) ? c_.sliding_window : 0;
    const float softcap = c_.attn_softcap;
    const int32_t hk = hk_;
    const int64_t qd = qd_;
    const float* q = r_.q_.data();
    float* out = r_.att_.data();
    // One work item per (sequence token, kv head): the `group` query heads that share a kv head
    // walk the same keys together.
    struct Item {
      int32_t seq;  // index into batch.seqs
      int32_t i;    // token index within the sequence
    };
    std::vector<Item> items;
    items.reserve(batch_.size());
    for (size_t si = 0; si < batch_.seqs.size(); ++si)
      for (int32_t i = 0; i < batch_.seqs[si].token_count; ++i)
        items.push_back({static_cast<int32_t>(si), i});
    const int64_t work = static_cast<int64_t>(items.size()) * hk;
    // Chunks of at least ~32K multiply-adds (keys x head_dim x group, twice).
    const int64_t keys = batch_.seqs.front().kv_end();
    const int64_t item_work = std::max<int64_t>(1, keys * head_dim * group * 2);
    const int64_t grain = std::max<int64_t>(std::max<int64_t>(1, (int64_t{1} << 15) / item_work),
                                            work / (4 * r_.pool_->num_threads()));
    r_.pool_->ParallelFor(work, [&](int64_t wb, int64_t we) {
      thread_local std::vector<float> scores;
      thread_local std::vector<int32_t> visible;
      for (int64_t wi = wb; wi < we; ++wi) {
        const Item& it = items[wi / hk];
        const int32_t kvh = static_cast<int32_t>(wi % hk);  // local KV head
        const BatchSequence& s = batch_.seqs[it.seq];
        const int64_t t = s.token_begin + it.i;
        const int64_t head0 = static_cast<int64_t>(kvh) * group * head_dim;
        cpu::AttendKvHead(s, it.i, slots_.data() + slot_begin_[it.seq],
                          r_.KeyAt(layer, 0) + static_cast<int64_t>(kvh) * head_dim,
                          r_.ValueAt(layer, 0) + static_cast<int64_t>(kvh) * head_dim, r_.kv_dim_,
                          q + t * qd + head0, group, head_dim, scale, visible, scores,
                          out + t * qd + head0, batch_.positions[t], window, softcap);
      }
    }, grain);
    return Status::Ok();
  }

  Status ProjectOutAdd(int32_t layer) {
    SI_RETURN_IF_ERROR(r_.Gather(group_, r_.att_.data(), n_, r_.q_cols_, att_full_));
    cpu::MatMul(r_.shards_[layer].wo, att_full_, n_, part_, *r_.pool_, r_.act_scratch_, inv_);
    return GatherAndAdd(w_.layers[r_.layers_.begin + layer].post_attn_norm);
  }

  Status ProjectGateUp(int32_t layer) {
    const LayerShard& s = r_.shards_[layer];
    const cpu::MatMulTarget gate_up[] = {{&s.w_gate, r_.gate_.data()}, {&s.w_up, r_.up_.data()}};
    cpu::MatMulShared(gate_up, r_.xb_.data(), n_, *r_.pool_, r_.act_scratch_, inv_);
    return Status::Ok();
  }

  Status SwiGlu() {
    const bool gelu = c_.ffn_activation == FfnActivation::kGeluTanh;
    ForEachToken(hid_, [&](int64_t t) {
      float* gate = r_.gate_.data() + t * hid_;
      const float* up = r_.up_.data() + t * hid_;
      if (gelu) {
        cpu::GeGluTanh(gate, up, hid_);
      } else {
        cpu::SwiGlu(gate, up, hid_);
      }
    });
    return Status::Ok();
  }

  Status ProjectDownAdd(int32_t layer) {
    SI_RETURN_IF_ERROR(r_.Gather(group_, r_.gate_.data(), n_, r_.hidden_rows_, ffn_full_));
    cpu::MatMul(r_.shards_[layer].w_down, ffn_full_, n_, part_, *r_.pool_, r_.act_scratch_,
                inv_);
    return GatherAndAdd(w_.layers[r_.layers_.begin + layer].post_ffn_norm);
  }

  // Final norm and this rank's vocabulary rows, for the rows whose logits are wanted.
  Status Output() {
    if (!r_.last_stage()) return group_->SendToNextStage(r_.x_.data(), n_ * c_.dim);
    const int64_t m = static_cast<int64_t>(batch_.logit_rows.size());
    if (m == 0) return Status::Ok();
    const int64_t dim = c_.dim;
    Grow(r_.final_, m * dim);
    for (int64_t i = 0; i < m; ++i)
      cpu::RmsNorm(&r_.x_[batch_.logit_rows[i] * dim], w_.final_norm.data, &r_.final_[i * dim],
                   dim, c_.norm_eps);
    cpu::MatMul(r_.output_, r_.final_.data(), m, logits_.data(), *r_.pool_, r_.act_scratch_,
                inv_);
    cpu::SoftCap(logits_.data(), m * r_.output_.view.rows, c_.final_softcap);
    return Status::Ok();
  }

 private:
  // xb = all-gather of this rank's rows of a dim-wide product; xb = rmsnorm(xb) * post_norm when
  // the model has post-norms (Gemma); x += xb (redundant on every rank).
  Status GatherAndAdd(const WeightVector& post_norm) {
    SI_RETURN_IF_ERROR(r_.Gather(group_, part_, n_, r_.dim_rows_, r_.xb_.data()));
    float* x = r_.x_.data();
    float* xb = r_.xb_.data();
    const int64_t dim = c_.dim;
    const bool post_norms = c_.post_norms;
    ForEachToken(dim, [&](int64_t t) {
      if (post_norms) cpu::RmsNorm(&xb[t * dim], post_norm.data, &xb[t * dim], dim, c_.norm_eps);
      for (int64_t i = t * dim; i < (t + 1) * dim; ++i) x[i] += xb[i];
    });
    return Status::Ok();
  }

  // fn(t) for every token t of the pass, each touching about `elements` values
  // (cpu::ForTokens: on the pool's threads for a tree pass or a large batch).
  template <typename Fn>
  void ForEachToken(int64_t elements, const Fn& fn) {
    cpu::ForTokens(*r_.pool_, n_, elements, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) fn(t);
    });
  }

  CpuShardRunner& r_;
  const ModelConfig& c_;
  const ModelWeights& w_;
  const ForwardBatch& batch_;
  Collective* const group_;
  const std::span<float> logits_;
  const int64_t n_;
  const bool inv_;
  int64_t qd_ = 0, kvd_ = 0, hid_ = 0;  // this rank's q, kv and hidden widths
  int32_t hq_ = 0, hk_ = 0;             // this rank's query and KV heads
  std::vector<int32_t> seq_of_;         // token -> index of its sequence in batch_.seqs
  // Cache slot of each position of sequence si: slots_[slot_begin_[si] + p], p < its kv_end().
  std::vector<int32_t> slots_;
  std::vector<int64_t> slot_begin_;
  // The full (gathered) attention output [n, q_dim], this rank's dim rows of a product
  // [n, dim share], the full SwiGLU output [n, hidden]: with one TP rank, att_, xb_ and gate_.
  float *att_full_ = nullptr, *part_ = nullptr, *ffn_full_ = nullptr;
};

Status CpuShardRunner::Forward(const ForwardBatch& batch,
                               std::span<const std::span<const int32_t>> tables,
                               Collective* group, std::span<float> logits) {
  if (tables.size() != batch.seqs.size()) return InternalError("one block table per sequence");
  if (group == nullptr && (layout_.tp_size > 1 || layout_.num_stages > 1))
    return FailedPreconditionError("not in a group");
  if (last_stage() && logits.size() < batch.logit_rows.size() * vocab_.count)
    return InternalError("logits buffer too small for this share");
  if (batch.size() == 0) return Status::Ok();
  Pass pass(*this, batch, tables, group, logits);
  return RunLlamaProgram(pass, static_cast<int32_t>(layers_.count));
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
