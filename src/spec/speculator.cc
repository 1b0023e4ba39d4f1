#include "spec/speculator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <optional>

#include "backend/registry.h"
#include "kv/kv_cache.h"
#include "model/loader.h"
#include "spec/draft_vocab.h"
#include "spec/dynamic_tree.h"
#include "spec/ngram.h"
#include "spec/spec_grammar.h"

namespace specinfer {

namespace {

// ---------------------------------------------------------------------------------------------
// Model drafts (model:PATH and layers:K).

class ModelSpeculator;

class ModelDraftSession final : public DraftSession {
 public:
  ModelDraftSession(ModelSpeculator& owner, SeqId seq) : owner_(owner), seq_(seq) {}
  ~ModelDraftSession() override;
  // ProposeBatch of this session alone: one code path, so batched and lone trees are equal.
  StatusOr<TokenTree> Propose(const DraftContext& ctx) override;
  bool honors_node_budget() const override { return true; }

  ModelSpeculator& owner() const { return owner_; }
  SeqId seq() const { return seq_; }
  std::vector<int32_t>& cached() { return cached_; }

 private:
  ModelSpeculator& owner_;
  SeqId seq_;
  std::vector<int32_t> cached_;  // tokens whose K/V the draft's cache holds, in order
};

// One session's proposal in progress inside a batched draft (ModelSpeculator::DraftWave).
struct DraftRun {
  ModelDraftSession* session = nullptr;
  const DraftContext* ctx = nullptr;
  TokenTree tree{0};
  Status status;
  int32_t n = 0;            // committed tokens (ctx->tokens.size())
  int32_t depth = 0;        // levels this tree gets
  bool growing = false;     // more levels to expand
  // The draft's logits at each frontier node, [frontier size, vocab]: rows of the wave's last
  // pass, or of `own` after a catch-up run alone.
  std::span<const float> rows;
  std::vector<float> own;
  std::vector<int32_t> frontier = {0};  // nodes whose children come next
  std::vector<int32_t> slot_of = {-1};  // node -> index in the masked window (root: none)
  std::vector<int32_t> fresh;           // the level just expanded
  int32_t window = 0;                   // tree entries in the cache after the n committed
  TreeMask mask;                        // the level in the pass (the batch points at it)
};

class ModelSpeculator final : public Speculator {
 public:
  // The cache takes the runner's KV geometry, sized for `max_sessions` full contexts.
  // `vocab`: the draft's own vocabulary, if it has one (its tokens are mapped on the way in and
  // its logits widened to the LLM's ids on the way out).
  ModelSpeculator(std::string name, std::shared_ptr<const Model> model,
                  std::unique_ptr<ModelRunner> runner, int32_t max_sessions,
                  std::optional<DraftVocab> vocab)
      : name_(std::move(name)),
        model_(std::move(model)),
        runner_(std::move(runner)),
        kv_(runner_->num_kv_blocks(), runner_->kv_block_size()),
        max_sessions_(max_sessions),
        vocab_(std::move(vocab)) {}

  const std::string& name() const override { return name_; }
  // The cache has room for max_sessions full contexts, not more: a session beyond them would
  // share the blocks and fail some request's draft halfway ("KV cache full"); refusing it here
  // lets the engine run that sequence without this draft (speculative_step.h).
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    if (live_sessions_.fetch_add(1) >= max_sessions_) {
      live_sessions_.fetch_sub(1);
      return ResourceExhaustedError("draft '" + name_ + "' has KV for " +
                                    std::to_string(max_sessions_) + " sequences, all in use");
    }
    return std::unique_ptr<DraftSession>(new ModelDraftSession(*this, kv_.AddSequence()));
  }
  void EndSession(SeqId seq) {
    kv_.RemoveSequence(seq);
    live_sessions_.fetch_sub(1);
  }

  bool batches_proposals() const override { return true; }
  std::vector<StatusOr<TokenTree>> ProposeBatch(std::span<DraftSession* const> sessions,
                                                std::span<const DraftContext> contexts) override;

 private:
  // Drafts every run's tree (each session appears once): catch-ups, then one pass per level.
  void DraftWave(std::span<DraftRun> runs);
  // Brings each growing run's cache to its committed tokens but the last and sets its rows to
  // the logits after the last: short catch-ups share one pass, long ones (a prompt) run alone.
  void CatchUp(std::span<DraftRun> runs);
  // Brings `r`'s cache from `common` entries to r.n alone, in chunks, into r.own.
  Status CatchUpAlone(DraftRun& r, int32_t common);
  // Expands r's frontier from its rows into r.fresh (tree level `level` + 1).
  void ExpandLevel(DraftRun& r, int32_t level);
  // Grows r's dynamic tree (spec/dynamic_tree.h) from its rows, one pass of r alone per round.
  void GrowDynamic(DraftRun& r);
  // Adds `nodes` of `tree` (their ancestors ran before) to `batch`: each node sees the committed
  // tokens, its tree ancestors and itself.
  Status AddLevel(DraftRun& r, const TokenTree& tree, std::span<const int32_t> nodes,
                  ForwardBatch& batch);
  // The width of the logits this speculator hands on: the LLM's vocabulary with a draft
  // vocabulary, else the draft model's own.
  int32_t vocab() const {
    return vocab_ ? vocab_->llm_vocab() : model_->config().vocab_size;
  }
  // The draft's runner on `batch`, with `batch`'s tokens in LLM ids: they are mapped to draft
  // rows first and the logits widened into `logits` ([logits rows, vocab()]).
  Status Forward(ForwardBatch& batch, std::vector<float>& logits);

  std::string name_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<ModelRunner> runner_;
  KvCacheManager kv_;
  const int32_t max_sessions_;
  std::atomic<int32_t> live_sessions_{0};
  std::vector<float> pass_logits_;  // the last shared pass's rows, [rows, vocab]
  const std::optional<DraftVocab> vocab_;
  std::vector<float> draft_logits_;  // with vocab_: the runner's own rows
};

ModelDraftSession::~ModelDraftSession() { owner_.EndSession(seq_); }

StatusOr<TokenTree> ModelDraftSession::Propose(const DraftContext& ctx) {
  DraftSession* self = this;
  return std::move(owner_.ProposeBatch(std::span(&self, 1), std::span(&ctx, 1))[0]);
}

std::vector<StatusOr<TokenTree>> ModelSpeculator::ProposeBatch(
    std::span<DraftSession* const> sessions, std::span<const DraftContext> contexts) {
  std::vector<StatusOr<TokenTree>> out;
  out.reserve(sessions.size());
  if (sessions.size() != contexts.size()) {
    for (size_t i = 0; i < sessions.size(); ++i)
      out.push_back(InvalidArgumentError("ProposeBatch: sessions and contexts differ in number"));
    return out;
  }
  // Waves: a session's k-th item goes in wave k, so no pass holds a session twice and its items
  // are served in order.
  std::vector<int32_t> wave(sessions.size(), -1);
  std::vector<ModelDraftSession*> own(sessions.size(), nullptr);
  int32_t waves = 0;
  for (size_t i = 0; i < sessions.size(); ++i) {
    auto* m = dynamic_cast<ModelDraftSession*>(sessions[i]);
    if (m == nullptr || &m->owner() != this) continue;
    own[i] = m;
    int32_t w = 0;
    for (size_t j = 0; j < i; ++j) w += own[j] == m;
    wave[i] = w;
    waves = std::max(waves, w + 1);
  }
  std::vector<std::optional<StatusOr<TokenTree>>> result(sessions.size());
  for (int32_t w = 0; w < waves; ++w) {
    std::vector<DraftRun> runs;
    std::vector<size_t> item;
    for (size_t i = 0; i < sessions.size(); ++i) {
      if (wave[i] != w) continue;
      DraftRun r;
      r.session = own[i];
      r.ctx = &contexts[i];
      runs.push_back(std::move(r));
      item.push_back(i);
    }
    DraftWave(runs);
    for (size_t k = 0; k < runs.size(); ++k) {
      if (runs[k].status.ok()) result[item[k]] = std::move(runs[k].tree);
      else result[item[k]] = runs[k].status;
    }
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (result[i].has_value()) out.push_back(std::move(*result[i]));
    else out.push_back(InvalidArgumentError("ProposeBatch: a session of another speculator than '" +
                                            name_ + "'"));
  }
  return out;
}

Status ModelSpeculator::Forward(ForwardBatch& batch, std::vector<float>& logits) {
  const size_t rows = batch.logit_rows.size();
  logits.resize(rows * static_cast<size_t>(vocab()));
  if (!vocab_) return runner_->Forward(batch, kv_, logits);
  for (int32_t& t : batch.tokens) t = vocab_->ToDraft(t);
  draft_logits_.resize(rows * static_cast<size_t>(vocab_->size()));
  SI_RETURN_IF_ERROR(runner_->Forward(batch, kv_, draft_logits_));
  vocab_->WidenLogits(draft_logits_, rows, logits);
  return Status::Ok();
}

void ModelSpeculator::DraftWave(std::span<DraftRun> runs) {
  const ModelConfig& c = model_->config();
  const int32_t vocab = this->vocab();
  for (DraftRun& r : runs) {
    r.n = static_cast<int32_t>(r.ctx->tokens.size());
    r.tree = TokenTree(r.ctx->tokens.back());
    // The deepest node sits at position n - 1 + depth, which must stay inside the draft's
    // context.
    r.depth = std::min({r.ctx->shape->depth(), r.ctx->max_depth, c.max_seq_len - r.n});
    r.growing = r.depth > 0 && r.ctx->max_nodes > 0;
  }
  CatchUp(runs);
  // Dynamic trees choose each round's nodes from the last round's logits: they grow alone
  // after the shared catch-up.
  for (DraftRun& r : runs) {
    if (!r.growing || !r.ctx->dynamic) continue;
    r.growing = false;
    GrowDynamic(r);
  }
  for (int32_t level = 0;; ++level) {
    ForwardBatch batch;
    std::vector<DraftRun*> in_pass;
    for (DraftRun& r : runs) {
      if (!r.growing) continue;
      ExpandLevel(r, level);
      if (level + 1 == r.depth || r.fresh.empty()) {
        r.growing = false;
        continue;
      }
      if (Status s = AddLevel(r, r.tree, r.fresh, batch); !s.ok()) {
        r.status = s;
        r.growing = false;
        continue;
      }
      in_pass.push_back(&r);
    }
    if (in_pass.empty()) break;
    const Status s = Forward(batch, pass_logits_);
    size_t row = 0;
    for (DraftRun* r : in_pass) {
      const auto count = static_cast<int32_t>(r->fresh.size());
      if (!s.ok()) {
        r->status = s;
        r->growing = false;
        continue;
      }
      r->rows = std::span<const float>(pass_logits_)
                    .subspan(row * vocab, static_cast<size_t>(count) * vocab);
      row += static_cast<size_t>(count);
      r->window += count;
      r->frontier.swap(r->fresh);
    }
  }
  // The trees' entries are dropped at the next catch-up (they follow the committed tokens).
}

void ModelSpeculator::CatchUp(std::span<DraftRun> runs) {
  // Catch-ups of fewer tokens than this share one batch-invariant pass (what a lone one of them
  // would run); longer ones are prompts and run alone with the faster batch-dependent kernels.
  constexpr int32_t kShared = 16;
  const int32_t vocab = this->vocab();
  ForwardBatch batch;
  std::vector<DraftRun*> shared;
  std::vector<int32_t> pos;
  for (DraftRun& r : runs) {
    if (!r.growing) continue;
    std::vector<int32_t>& cached = r.session->cached();
    const std::span<const int32_t> tokens = r.ctx->tokens;
    // Keep the longest common prefix with what the cache holds, but always run the last token:
    // its logits are the first level's.
    int32_t common = 0;
    const int32_t limit = std::min<int32_t>(static_cast<int32_t>(cached.size()), r.n - 1);
    while (common < limit && cached[static_cast<size_t>(common)] == tokens[common]) ++common;
    kv_.Truncate(r.session->seq(), common);
    cached.resize(static_cast<size_t>(common));
    const int32_t count = r.n - common;
    Status s;
    if (count >= kShared) {
      s = CatchUpAlone(r, common);
    } else {
      s = kv_.Reserve(r.session->seq(), r.n);
      if (s.ok()) {
        pos.resize(static_cast<size_t>(count));
        std::iota(pos.begin(), pos.end(), common);
        batch.AddSequence(r.session->seq(), tokens.subspan(static_cast<size_t>(common)), pos,
                          common, nullptr);
        batch.logit_rows.push_back(batch.size() - 1);
        shared.push_back(&r);
      }
    }
    if (!s.ok()) {
      r.status = s;
      r.growing = false;
    }
  }
  if (shared.empty()) return;
  batch.batch_invariant = true;
  const Status s = Forward(batch, pass_logits_);
  for (size_t i = 0; i < shared.size(); ++i) {
    DraftRun& r = *shared[i];
    if (!s.ok()) {
      r.status = s;
      r.growing = false;
      continue;
    }
    r.rows = std::span<const float>(pass_logits_).subspan(i * vocab, static_cast<size_t>(vocab));
    std::vector<int32_t>& cached = r.session->cached();
    cached.insert(cached.end(), r.ctx->tokens.begin() + static_cast<std::ptrdiff_t>(cached.size()),
                  r.ctx->tokens.end());
  }
}

Status ModelSpeculator::CatchUpAlone(DraftRun& r, int32_t common) {
  const std::span<const int32_t> tokens = r.ctx->tokens;
  const SeqId seq = r.session->seq();
  std::vector<int32_t>& cached = r.session->cached();
  constexpr int32_t kChunk = 512;
  for (int32_t begin = common; begin < r.n; begin += kChunk) {
    const int32_t count = std::min(kChunk, r.n - begin);
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, begin + count));
    ForwardBatch batch;
    std::vector<int32_t> pos(static_cast<size_t>(count));
    std::iota(pos.begin(), pos.end(), begin);
    batch.AddSequence(seq, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)),
                      pos, begin, nullptr);
    if (begin + count == r.n) batch.logit_rows = {count - 1};
    // Draft outputs need not be batch-invariant (verification makes the result exact), so long
    // catch-ups (the prompt) may use the faster batch-dependent kernels.
    batch.batch_invariant = count < 16;
    SI_RETURN_IF_ERROR(Forward(batch, r.own));
    cached.insert(cached.end(), tokens.begin() + begin, tokens.begin() + begin + count);
  }
  r.rows = r.own;
  return Status::Ok();
}

void ModelSpeculator::ExpandLevel(DraftRun& r, int32_t level) {
  const auto vocab = static_cast<size_t>(this->vocab());
  const int32_t k = r.ctx->shape->widths[static_cast<size_t>(level)];
  r.fresh.clear();
  for (size_t f = 0; f < r.frontier.size(); ++f) {
    const int32_t before = r.tree.size();
    ProposeChildren(r.tree, r.frontier[f], r.rows.subspan(f * vocab, vocab), k, *r.ctx->sampling,
                    *r.ctx->rng, r.ctx->speculator_index, r.ctx->max_nodes);
    for (int32_t v = before; v < r.tree.size(); ++v) r.fresh.push_back(v);
  }
}

void ModelSpeculator::GrowDynamic(DraftRun& r) {
  // One round of the growth: its nodes in a pass of their own, as a static level would run.
  auto run = [&](const TokenTree& t, std::span<const int32_t> nodes,
                 std::vector<float>& out) -> Status {
    ForwardBatch batch;
    SI_RETURN_IF_ERROR(AddLevel(r, t, nodes, batch));
    SI_RETURN_IF_ERROR(Forward(batch, out));
    r.window += static_cast<int32_t>(nodes.size());
    return Status::Ok();
  };
  DynamicTreeOptions o;
  o.max_nodes = r.ctx->max_nodes;
  o.max_depth = r.depth;
  // Nodes whose cumulative probability is below 1% are hardly ever accepted; not drafting them
  // saves their draft and LLM tokens.
  o.min_prob = 0.01f;
  StatusOr<TokenTree> tree = GrowDynamicTree(r.ctx->tokens.back(), r.rows, o, *r.ctx->sampling,
                                             *r.ctx->rng, r.ctx->speculator_index, run);
  if (tree.ok()) {
    r.tree = std::move(tree).value();
  } else {
    r.status = tree.status();
  }
}

Status ModelSpeculator::AddLevel(DraftRun& r, const TokenTree& tree,
                                 std::span<const int32_t> nodes, ForwardBatch& batch) {
  const int32_t count = static_cast<int32_t>(nodes.size());
  r.mask = TreeMask::Empty(count, r.window + count);
  std::vector<int32_t> toks(static_cast<size_t>(count)), pos(static_cast<size_t>(count));
  r.slot_of.resize(static_cast<size_t>(tree.size()), -1);
  for (int32_t i = 0; i < count; ++i) {
    const int32_t v = nodes[static_cast<size_t>(i)];
    toks[static_cast<size_t>(i)] = tree.node(v).token;
    pos[static_cast<size_t>(i)] = r.n - 1 + tree.node(v).depth;
    r.slot_of[static_cast<size_t>(v)] = r.window + i;
    for (int32_t a = v; a > 0; a = tree.node(a).parent)
      r.mask.Set(i, r.slot_of[static_cast<size_t>(a)]);
  }
  SI_RETURN_IF_ERROR(kv_.Reserve(r.session->seq(), r.n + r.window + count));
  const int32_t first = batch.size();
  batch.AddSequence(r.session->seq(), toks, pos, r.n, &r.mask, r.window);
  for (int32_t i = 0; i < count; ++i) batch.logit_rows.push_back(first + i);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Prompt lookup (ngram[:N]).

class NgramSpeculator final : public Speculator {
 public:
  NgramSpeculator(std::string name, int32_t max_ngram)
      : name_(std::move(name)), max_ngram_(max_ngram) {}
  const std::string& name() const override { return name_; }
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    return std::unique_ptr<DraftSession>(new NgramSession(max_ngram_));
  }

 private:
  class NgramSession final : public DraftSession {
   public:
    explicit NgramSession(int32_t max_ngram) : max_ngram_(max_ngram) {}
    StatusOr<TokenTree> Propose(const DraftContext& ctx) override {
      if (ctx.dynamic) {
        return PromptLookupDynamicTree(ctx.tokens, std::min(ctx.shape->depth(), ctx.max_depth),
                                       ctx.max_nodes, max_ngram_, ctx.speculator_index);
      }
      return PromptLookupTree(ctx.tokens, *ctx.shape, ctx.max_depth, max_ngram_,
                              ctx.speculator_index, ctx.max_nodes);
    }
    bool honors_node_budget() const override { return true; }

   private:
    int32_t max_ngram_;
  };

  std::string name_;
  int32_t max_ngram_;
};

StatusOr<std::unique_ptr<Speculator>> CreateModelSpeculator(
    std::string name, std::shared_ptr<const Model> model, const SpeculatorOptions& o,
    std::optional<DraftVocab> vocab = std::nullopt) {
  const ModelConfig& c = model->config();
  if (o.kv_block_size <= 0 || o.max_sequences <= 0)
    return InvalidArgumentError("draft KV cache needs positive block size and sequence count");
  RunnerOptions ro;
  ro.num_kv_blocks = KvBlocksPerSequence(c.max_seq_len, o.kv_block_size) * o.max_sequences;
  ro.kv_block_size = o.kv_block_size;
  ro.pool = o.pool;
  ro.num_threads = o.num_threads;
  ro.tokenizer = o.llm_tokenizer;
  ro.device = o.device;
  ro.cuda_graphs = o.cuda_graphs;
  SI_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, CreateRunner(o.backend, model, ro));
  if (runner->num_kv_blocks() <= 0 || runner->kv_block_size() <= 0)
    return InternalError("draft runner " + runner->name() + " reports no KV storage");
  return std::unique_ptr<Speculator>(new ModelSpeculator(
      std::move(name), std::move(model), std::move(runner), o.max_sequences, std::move(vocab)));
}

}  // namespace

std::vector<StatusOr<TokenTree>> Speculator::ProposeBatch(std::span<DraftSession* const> sessions,
                                                          std::span<const DraftContext> contexts) {
  std::vector<StatusOr<TokenTree>> out;
  out.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (i < contexts.size()) out.push_back(sessions[i]->Propose(contexts[i]));
    else
      out.push_back(InvalidArgumentError("ProposeBatch: sessions and contexts differ in number"));
  }
  return out;
}

void Speculator::BeginBatch(std::span<DraftSession* const> sessions,
                            std::span<const DraftContext> contexts) {
  for (size_t i = 0; i < sessions.size() && i < contexts.size(); ++i)
    sessions[i]->Begin(contexts[i]);
}

void ProposeChildren(TokenTree& tree, int32_t node, std::span<const float> logits, int32_t k,
                     const SamplingParams& sampling, Rng& rng, int32_t speculator,
                     int32_t max_nodes) {
  auto full = [&] { return tree.size() - 1 >= max_nodes; };
  if (sampling.greedy()) {
    std::vector<int32_t> top(logits.size());
    std::iota(top.begin(), top.end(), 0);
    k = std::min<int32_t>(k, static_cast<int32_t>(logits.size()));
    std::partial_sort(top.begin(), top.begin() + k, top.end(), [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
      return la > lb || (la == lb && a < b);
    });
    for (int32_t i = 0; i < k && !full(); ++i)
      tree.Propose(node, top[static_cast<size_t>(i)], speculator);
    return;
  }
  std::vector<float> q;
  ComputeProbs(logits, sampling, q);
  std::vector<int32_t> draws(static_cast<size_t>(k));
  for (int32_t& x : draws) x = SampleFromProbs(q, rng);
  const int32_t dist = tree.AddDistribution(std::move(q));
  // Past the node budget, the draws not yet proposed are dropped: whether a draw is proposed
  // depends on the earlier draws only, never on its own value, so each proposal stays a draw
  // from q (spec/dynamic_tree.h).
  for (int32_t x : draws) {
    if (full()) break;
    tree.Propose(node, x, speculator, dist);
  }
}

StatusOr<std::unique_ptr<Speculator>> CreateSpeculator(std::string_view spec,
                                                       std::shared_ptr<const Model> llm,
                                                       const SpeculatorOptions& o) {
  SI_ASSIGN_OR_RETURN(const DraftSpec d, ParseDraftSpec(spec));
  const ModelConfig& lc = llm->config();
  if (d.kind == DraftSpec::Kind::kNgram) {
    return std::unique_ptr<Speculator>(new NgramSpeculator(std::string(spec), d.ngram()));
  }
  if (d.kind == DraftSpec::Kind::kLayers) {
    SI_RETURN_IF_ERROR(CheckDraftFitsModel(d, lc.n_layers));
    return CreateModelSpeculator(std::string(spec), Model::FirstLayers(llm, d.n), o);
  }
  // model:PATH. Its tokenizer is optional: a llama2.c draft may have no tokenizer.bin beside it.
  // The draft serves the LLM's context (a shorter own context limits how far it can guess).
  ServingLoadOptions lo;
  lo.tokenizer_optional = true;
  lo.context_length = lc.max_seq_len;
  lo.prefault = true;
  lo.draft = true;
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelForServing(d.model_path, lo));
  std::unique_ptr<Model> draft = std::move(loaded.model);
  std::unique_ptr<Tokenizer> draft_tokenizer = std::move(loaded.tokenizer);
  const ModelConfig& dc = draft->config();
  const std::string share = "; a draft must share the model's vocabulary";
  // A draft with a vocabulary of its own: a table of the model's token ids (spec/draft_vocab.h).
  std::optional<DraftVocab> vocab;
  if (!dc.draft_token_ids.empty()) {
    StatusOr<DraftVocab> v = DraftVocab::Create(dc.draft_token_ids, lc.vocab_size);
    if (!v.ok()) return v.status().WithContext("draft '" + std::string(spec) + "'");
    vocab = std::move(v).value();
  } else if (dc.vocab_size != lc.vocab_size)
    return InvalidArgumentError("draft '" + std::string(spec) + "' has a vocabulary of " +
                                std::to_string(dc.vocab_size) + " tokens, the model " +
                                std::to_string(lc.vocab_size) + share);
  if (o.llm_tokenizer != nullptr && draft_tokenizer != nullptr) {
    const Tokenizer& a = *o.llm_tokenizer;
    const Tokenizer& b = *draft_tokenizer;
    if (a.vocab_size() != b.vocab_size())
      return InvalidArgumentError("draft '" + std::string(spec) + "' has a tokenizer of " +
                                  std::to_string(b.vocab_size()) + " tokens, the model " +
                                  std::to_string(a.vocab_size()) + share);
    for (int32_t id = 0; id < lc.vocab_size; ++id) {
      if (a.TokenPiece(id) != b.TokenPiece(id))
        return InvalidArgumentError("draft '" + std::string(spec) + "': token " +
                                    std::to_string(id) + " is '" + std::string(b.TokenPiece(id)) +
                                    "' there but '" + std::string(a.TokenPiece(id)) +
                                    "' in the model" + share);
    }
  } else if (o.llm_tokenizer != nullptr && dc.vocab_fingerprint.has_value()) {
    // A draft that carries the fingerprint of its vocabulary instead of the tokenizer itself.
    const uint64_t want = VocabFingerprint(*o.llm_tokenizer);
    if (*dc.vocab_fingerprint != want)
      return InvalidArgumentError(fmt::format(
          "draft '{}' was made for a vocabulary with fingerprint {:016x}, the model's is {:016x}{}",
          spec, *dc.vocab_fingerprint, want, share));
  }
  return CreateModelSpeculator(std::string(spec), std::shared_ptr<const Model>(std::move(draft)),
                               o, std::move(vocab));
}

}  // namespace specinfer
