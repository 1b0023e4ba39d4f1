#include "spec/speculator.h"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "backend/registry.h"
#include "kv/kv_cache.h"
#include "model/loader.h"
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
  StatusOr<TokenTree> Propose(const DraftContext& ctx) override;
  bool honors_node_budget() const override { return true; }

 private:
  // Brings the draft's cache to tokens[0, n-1) and returns the logits after tokens[n-1].
  Status CatchUp(std::span<const int32_t> tokens, std::vector<float>& logits);

  ModelSpeculator& owner_;
  SeqId seq_;
  std::vector<int32_t> cached_;  // tokens whose K/V the draft's cache holds, in order
};

class ModelSpeculator final : public Speculator {
 public:
  // The cache takes the runner's KV geometry, sized for `max_sessions` full contexts.
  ModelSpeculator(std::string name, std::shared_ptr<const Model> model,
                  std::unique_ptr<ModelRunner> runner, int32_t max_sessions)
      : name_(std::move(name)),
        model_(std::move(model)),
        runner_(std::move(runner)),
        kv_(runner_->num_kv_blocks(), runner_->kv_block_size()),
        max_sessions_(max_sessions) {}

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

  const Model& model() const { return *model_; }
  ModelRunner& runner() { return *runner_; }
  KvCacheManager& kv() { return kv_; }

 private:
  std::string name_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<ModelRunner> runner_;
  KvCacheManager kv_;
  const int32_t max_sessions_;
  std::atomic<int32_t> live_sessions_{0};
};

ModelDraftSession::~ModelDraftSession() { owner_.EndSession(seq_); }

Status ModelDraftSession::CatchUp(std::span<const int32_t> tokens, std::vector<float>& logits) {
  KvCacheManager& kv = owner_.kv();
  const int32_t n = static_cast<int32_t>(tokens.size());
  // Keep the longest common prefix with what the cache holds, but always run the last token:
  // its logits are the first level's.
  int32_t common = 0;
  const int32_t limit = std::min<int32_t>(static_cast<int32_t>(cached_.size()), n - 1);
  while (common < limit && cached_[static_cast<size_t>(common)] == tokens[common]) ++common;
  kv.Truncate(seq_, common);
  cached_.resize(static_cast<size_t>(common));
  constexpr int32_t kChunk = 512;
  for (int32_t begin = common; begin < n; begin += kChunk) {
    const int32_t count = std::min(kChunk, n - begin);
    SI_RETURN_IF_ERROR(kv.Reserve(seq_, begin + count));
    ForwardBatch batch;
    std::vector<int32_t> pos(static_cast<size_t>(count));
    std::iota(pos.begin(), pos.end(), begin);
    batch.AddSequence(seq_, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)),
                      pos, begin, nullptr);
    if (begin + count == n) batch.logit_rows = {count - 1};
    // Draft outputs need not be batch-invariant (verification makes the result exact), so long
    // catch-ups (the prompt) may use the faster batch-dependent kernels.
    batch.batch_invariant = count < 16;
    SI_RETURN_IF_ERROR(owner_.runner().Forward(batch, kv, logits));
    cached_.insert(cached_.end(), tokens.begin() + begin, tokens.begin() + begin + count);
  }
  return Status::Ok();
}

StatusOr<TokenTree> ModelDraftSession::Propose(const DraftContext& ctx) {
  const int32_t n = static_cast<int32_t>(ctx.tokens.size());
  TokenTree tree(ctx.tokens.back());
  const ModelConfig& c = owner_.model().config();
  // The deepest node sits at position n - 1 + depth, which must stay inside the draft's context.
  const int32_t depth =
      std::min({ctx.shape->depth(), ctx.max_depth, c.max_seq_len - n});
  if (depth <= 0 || ctx.max_nodes <= 0) return tree;
  const int32_t vocab = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  SI_RETURN_IF_ERROR(CatchUp(ctx.tokens, logits));

  KvCacheManager& kv = owner_.kv();
  std::vector<int32_t> slot_of(1, -1);      // node -> index in the masked window (root: none)
  int32_t window = 0;                       // tree entries in the cache after the n committed
  // Runs `nodes` (whose ancestors ran before): each sees the committed tokens, its tree
  // ancestors and itself.
  auto run = [&](const TokenTree& t, std::span<const int32_t> nodes,
                 std::vector<float>& out) -> Status {
    const int32_t count = static_cast<int32_t>(nodes.size());
    TreeMask mask = TreeMask::Empty(count, window + count);
    std::vector<int32_t> toks(static_cast<size_t>(count)), pos(static_cast<size_t>(count));
    slot_of.resize(static_cast<size_t>(t.size()), -1);
    for (int32_t i = 0; i < count; ++i) {
      const int32_t v = nodes[static_cast<size_t>(i)];
      toks[static_cast<size_t>(i)] = t.node(v).token;
      pos[static_cast<size_t>(i)] = n - 1 + t.node(v).depth;
      slot_of[static_cast<size_t>(v)] = window + i;
      for (int32_t a = v; a > 0; a = t.node(a).parent)
        mask.Set(i, slot_of[static_cast<size_t>(a)]);
    }
    SI_RETURN_IF_ERROR(kv.Reserve(seq_, n + window + count));
    ForwardBatch batch;
    batch.AddSequence(seq_, toks, pos, n, &mask, window);
    batch.logit_rows.resize(static_cast<size_t>(count));
    std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), 0);
    out.resize(static_cast<size_t>(count) * vocab);
    SI_RETURN_IF_ERROR(owner_.runner().Forward(batch, kv, out));
    window += count;
    return Status::Ok();
  };
  // The tree's entries are dropped at the next catch-up (they follow the committed tokens).
  if (ctx.dynamic) {
    DynamicTreeOptions o;
    o.max_nodes = ctx.max_nodes;
    o.max_depth = depth;
    // Nodes whose cumulative probability is below 1% are hardly ever accepted; not drafting
    // them saves their draft and LLM tokens.
    o.min_prob = 0.01f;
    return GrowDynamicTree(ctx.tokens.back(), logits, o, *ctx.sampling, *ctx.rng,
                           ctx.speculator_index, run);
  }

  std::vector<int32_t> frontier = {0};      // nodes whose children come next
  std::vector<int32_t> fresh;
  for (int32_t level = 0; level < depth; ++level) {
    const int32_t k = ctx.shape->widths[static_cast<size_t>(level)];
    fresh.clear();
    for (size_t f = 0; f < frontier.size(); ++f) {
      std::span<const float> row(logits.data() + f * vocab, static_cast<size_t>(vocab));
      const int32_t before = tree.size();
      ProposeChildren(tree, frontier[f], row, k, *ctx.sampling, *ctx.rng, ctx.speculator_index,
                      ctx.max_nodes);
      for (int32_t v = before; v < tree.size(); ++v) fresh.push_back(v);
    }
    if (level + 1 == depth || fresh.empty()) break;
    SI_RETURN_IF_ERROR(run(tree, fresh, logits));
    frontier.swap(fresh);
  }
  return tree;
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

StatusOr<std::unique_ptr<Speculator>> CreateModelSpeculator(std::string name,
                                                            std::shared_ptr<const Model> model,
                                                            const SpeculatorOptions& o) {
  const ModelConfig& c = model->config();
  if (o.kv_block_size <= 0 || o.max_sequences <= 0)
    return InvalidArgumentError("draft KV cache needs positive block size and sequence count");
  RunnerOptions ro;
  ro.num_kv_blocks = KvBlocksPerSequence(c.max_seq_len, o.kv_block_size) * o.max_sequences;
  ro.kv_block_size = o.kv_block_size;
  ro.pool = o.pool;
  ro.num_threads = o.num_threads;
  ro.tokenizer = o.llm_tokenizer;
  SI_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, CreateRunner(o.backend, model, ro));
  if (runner->num_kv_blocks() <= 0 || runner->kv_block_size() <= 0)
    return InternalError("draft runner " + runner->name() + " reports no KV storage");
  return std::unique_ptr<Speculator>(
      new ModelSpeculator(std::move(name), std::move(model), std::move(runner), o.max_sequences));
}

}  // namespace

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
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelForServing(d.model_path, lo));
  std::unique_ptr<Model> draft = std::move(loaded.model);
  std::unique_ptr<Tokenizer> draft_tokenizer = std::move(loaded.tokenizer);
  const ModelConfig& dc = draft->config();
  const std::string share = "; a draft must share the model's vocabulary";
  if (dc.vocab_size != lc.vocab_size)
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
  }
  return CreateModelSpeculator(std::string(spec), std::shared_ptr<const Model>(std::move(draft)),
                               o);
}

}  // namespace specinfer
