// A model draft's session limit (issue #18): a draft whose KV cache holds fewer sequences than
// the engine runs, or whose cache has no room for a tree, must leave the sequence without that
// draft (for the sequence, or for the step) instead of failing the request; greedy outputs stay
// those of incremental decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

// stories260K serving itself as "model:" draft, with KV for `draft_sequences` sequences, under
// an engine that runs up to `max_sequences`.
std::unique_ptr<Engine> MakeEngine(int32_t max_sequences, int32_t draft_sequences) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.max_sequences = max_sequences;
  o.speculator_factory =
      [draft_sequences](
          std::shared_ptr<const Model> model,
          const Tokenizer& tokenizer) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    SpeculatorOptions so;
    so.max_sequences = draft_sequences;
    so.num_threads = 1;
    so.llm_tokenizer = &tokenizer;
    SI_ASSIGN_OR_RETURN(auto s,
                        CreateSpeculator("model:" + testing::Stories260KModel(), model, so));
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::move(s));
    return out;
  };
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

Speculator* Draft(Engine& e) {
  auto s = e.GetSpeculator("model:" + testing::Stories260KModel());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

struct Outcome {
  std::optional<StatusOr<GenerateResult>> done;
};

TEST(DraftSessions, MoreSequencesThanTheDraftHoldsAllSucceedAsWithoutSpeculation) {
  auto engine = MakeEngine(3, 1);
  ASSERT_TRUE(engine);
  Speculator* draft = Draft(*engine);
  ASSERT_NE(draft, nullptr);
  const char* texts[] = {"Once upon a time", "The cat sat on the mat", "Lily and Ben"};
  // Long enough that the three together exceed the draft's cache (one full context).
  std::vector<GenerateRequest> plain, spec;
  for (const char* text : texts) {
    GenerateRequest r;
    r.prompt_tokens = *engine->EncodePrompt(text);
    r.max_new_tokens = 480;      // no stop tokens: every sequence runs its full length
    r.sampling.temperature = 0;  // greedy
    plain.push_back(r);
    // `ngram + model`: the prompt lookup stays when the model draft has no room.
    r.speculators = {*engine->GetSpeculator("ngram:2"), draft};
    r.tree_shape = *TreeShape::Parse("2,2,1");
    spec.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const GenerateRequest& r : plain) {
    auto g = engine->Generate(r);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    alone.push_back(g->tokens);
  }
  BatchOptions o;
  o.max_sequences = 3;
  EngineCore batch(engine->runner(), engine->kv(), o);
  std::vector<Outcome> out(spec.size());
  for (size_t i = 0; i < spec.size(); ++i) {
    auto a = batch.Add(
        spec[i], [](int32_t, std::span<const float>) { return true; },
        [&out, i](StatusOr<GenerateResult> r) { out[i].done = std::move(r); });
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_EQ(*a, EngineCore::Admission::kAdmitted) << i;
  }
  for (int steps = 0; !batch.idle() && steps < 10000; ++steps) batch.Step();
  for (size_t i = 0; i < spec.size(); ++i) {
    ASSERT_TRUE(out[i].done.has_value()) << i;
    ASSERT_TRUE(out[i].done->ok()) << i << ": " << out[i].done->status().ToString();
    EXPECT_EQ((*out[i].done)->tokens, alone[i]) << "sequence " << i;
  }
  // The first sequence got the draft's one session; the others went on with prompt lookup.
  const std::string model_draft = "model:" + testing::Stories260KModel();
  EXPECT_EQ((*out[0].done)->stats.spec.speculator_names,
            (std::vector<std::string>{"ngram:2", model_draft}));
  for (size_t i = 1; i < spec.size(); ++i) {
    EXPECT_EQ((*out[i].done)->stats.spec.speculator_names, std::vector<std::string>{"ngram:2"})
        << i;
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
  // Sessions are given back: a new sequence gets the draft again.
  spec[0].max_new_tokens = 10;
  auto again = engine->Generate(spec[0]);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->stats.spec.speculator_names, (std::vector<std::string>{"ngram:2", model_draft}));
}

TEST(DraftSessions, ADraftWithoutRoomForItsTreeAtTheContextEndDoesNotFailGenerate) {
  // One sequence, a draft sized for one: near the end of the context a wide tree's levels need
  // more positions than a full context has; that step goes without the draft.
  auto engine = MakeEngine(1, 1);
  ASSERT_TRUE(engine);
  Speculator* draft = Draft(*engine);
  ASSERT_NE(draft, nullptr);
  GenerateRequest r;
  r.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  r.max_new_tokens = engine->model().config().max_seq_len;  // clamped to the context's end
  r.sampling.temperature = 0;
  auto plain = engine->Generate(r);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  r.speculators = {draft};
  r.tree_shape = *TreeShape::Parse("4,4,4");
  auto speculative = engine->Generate(r);
  ASSERT_TRUE(speculative.ok()) << speculative.status().ToString();
  EXPECT_EQ(speculative->tokens, plain->tokens);
}

// A speculator whose sessions open but never have room to propose (as a draft whose cache is
// full would answer): every step goes without it.
class FullSpeculator final : public Speculator {
 public:
  const std::string& name() const override { return name_; }
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    return std::unique_ptr<DraftSession>(new Session());
  }

 private:
  struct Session final : DraftSession {
    StatusOr<TokenTree> Propose(const DraftContext&) override {
      return ResourceExhaustedError("KV cache full");
    }
  };
  std::string name_ = "full";
};

TEST(DraftSessions, ADraftOutOfRoomMidSequenceIsLeftOutOfTheStep) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.speculator_factory =
      [](std::shared_ptr<const Model>,
         const Tokenizer&) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::make_unique<FullSpeculator>());
    return out;
  };
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  GenerateRequest r;
  r.prompt_tokens = *(*engine)->EncodePrompt("Once upon a time");
  r.max_new_tokens = 40;
  r.sampling.temperature = 0;
  auto plain = (*engine)->Generate(r);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  r.speculators = {*(*engine)->GetSpeculator("full"), *(*engine)->GetSpeculator("ngram:1")};
  r.tree_shape = *TreeShape::Parse("2,1");
  auto speculative = (*engine)->Generate(r);
  ASSERT_TRUE(speculative.ok()) << speculative.status().ToString();
  EXPECT_EQ(speculative->tokens, plain->tokens);
}

// A speculator whose trees are the full expansion of the shape (to the depth the request has
// left), with tokens counting up from `first`: two of them with far-apart `first` share no node.
// Proposes its tree shape's full expansion with made-up tokens (first, first + 1, ...), at most
// ctx.max_nodes nodes when `honors_budget` (as the local drafts do), else always the whole shape
// (as a remote SSM worker does).
class FullShapeSpeculator final : public Speculator {
 public:
  FullShapeSpeculator(std::string name, int32_t first, bool honors_budget = true)
      : name_(std::move(name)), first_(first), honors_(honors_budget) {}
  const std::string& name() const override { return name_; }
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    return std::unique_ptr<DraftSession>(new Session(first_, honors_));
  }

 private:
  struct Session final : DraftSession {
    Session(int32_t first, bool honors) : first(first), honors(honors) {}
    StatusOr<TokenTree> Propose(const DraftContext& ctx) override {
      TokenTree t(ctx.tokens.back());
      std::vector<int32_t> frontier{0};
      int32_t next = first;
      const int32_t limit = honors ? ctx.max_nodes : 1 << 30;
      for (int32_t d = 0; d < std::min(ctx.shape->depth(), ctx.max_depth); ++d) {
        std::vector<int32_t> grown;
        for (int32_t parent : frontier) {
          for (int32_t k = 0; k < ctx.shape->widths[d] && t.size() - 1 < limit; ++k)
            grown.push_back(t.Propose(parent, next++ % 512, ctx.speculator_index));
        }
        frontier = std::move(grown);
      }
      return t;
    }
    bool honors_node_budget() const override { return honors; }
    int32_t first;
    bool honors;
  };
  std::string name_;
  int32_t first_;
  bool honors_;
};

// An engine of stories260K with the two given test drafts, KV for one sequence at full context
// plus one tree of TreeShape::kMaxNodes nodes.
std::unique_ptr<Engine> WideDraftEngine(bool second_honors_budget) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.max_sequences = 1;
  o.spec_budget = SpecBudgetMode::kStatic;
  o.speculator_factory =
      [second_honors_budget](
          std::shared_ptr<const Model>,
          const Tokenizer&) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::make_unique<FullShapeSpeculator>("wide-a", 1));
    out.push_back(std::make_unique<FullShapeSpeculator>("wide-b", 256, second_honors_budget));
    return out;
  };
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

TEST(DraftSessions, MergedWideTreesAreCappedToTheRoomASequenceIsAdmittedWith) {
  // Two drafts of 510-node trees (1,020 merged) near the end of the context, against a KV cache
  // sized for one sequence at full context plus one 512-node tree. Both drafts are kept; the
  // second proposes within what the first left, so no step's tree exceeds 512 nodes, the cache
  // never overruns, and the output is the plain one. (Before: the merged tree overran the cache
  // at the first step; then, the second draft was left out altogether.)
  auto engine = WideDraftEngine(true);
  ASSERT_TRUE(engine);
  const int32_t context = engine->context_length();
  const std::vector<int32_t> sentence = *engine->EncodePrompt("Once upon a time");
  GenerateRequest r;
  while (static_cast<int32_t>(r.prompt_tokens.size()) < context - 24)
    r.prompt_tokens.push_back(sentence[r.prompt_tokens.size() % sentence.size()]);
  r.max_new_tokens = context;  // clamped to the context's end
  r.sampling.temperature = 0;
  auto plain = engine->Generate(r);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->finish_reason, FinishReason::kLength);
  r.speculators = {*engine->GetSpeculator("wide-a"), *engine->GetSpeculator("wide-b")};
  r.tree_shape = *TreeShape::Parse("2,2,2,2,2,2,2,2");
  ASSERT_EQ(r.tree_shape.MaxNodes(), 510);
  auto speculative = engine->Generate(r);
  ASSERT_TRUE(speculative.ok()) << speculative.status().ToString();
  EXPECT_EQ(speculative->tokens, plain->tokens);
  const SpeculationStats& sp = speculative->stats.spec;
  EXPECT_EQ(sp.speculator_names, (std::vector<std::string>{"wide-a", "wide-b"}));
  ASSERT_EQ(sp.proposed_by.size(), 2u);
  EXPECT_GT(sp.proposed_by[1], 0) << "the second draft never proposed anything";
  EXPECT_LE(sp.tree_nodes, TreeShape::kMaxNodes * speculative->stats.decode_passes);
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

TEST(DraftSessions, ADraftThatIgnoresBudgetsIsMergedOnlyWhereItsWholeShapeFits) {
  // As a remote SSM worker does, the second draft returns its whole shape whatever the budget:
  // at 510 nodes it never fits beside the first's 510 and is not merged (decided from the shape,
  // not from what it proposed); at 254 nodes it fits.
  auto engine = WideDraftEngine(false);
  ASSERT_TRUE(engine);
  GenerateRequest r;
  r.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  r.max_new_tokens = 24;
  r.sampling.temperature = 0;
  auto plain = engine->Generate(r);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  r.speculators = {*engine->GetSpeculator("wide-a"), *engine->GetSpeculator("wide-b")};
  r.tree_shape = *TreeShape::Parse("2,2,2,2,2,2,2,2");
  // The first 8 tokens only, so that every step may go the shape's full depth (near the end of
  // the request the depth cap shrinks the shape's expansion, and then it fits).
  std::vector<int32_t> first;
  auto wide = engine->Generate(r, [&](int32_t t, std::span<const float>) {
    first.push_back(t);
    return first.size() < 8;
  });
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_EQ(first, std::vector<int32_t>(plain->tokens.begin(), plain->tokens.begin() + 8));
  ASSERT_EQ(wide->stats.spec.proposed_by.size(), 2u);
  EXPECT_GT(wide->stats.spec.proposed_by[0], 0);
  EXPECT_EQ(wide->stats.spec.proposed_by[1], 0);

  r.tree_shape = *TreeShape::Parse("2,2,2,2,2,2,2");  // 254 nodes: both fit
  auto both = engine->Generate(r);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->tokens, plain->tokens);
  EXPECT_GT(both->stats.spec.proposed_by[1], 0);
}

}  // namespace
}  // namespace specinfer
