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
class FullShapeSpeculator final : public Speculator {
 public:
  FullShapeSpeculator(std::string name, int32_t first) : name_(std::move(name)), first_(first) {}
  const std::string& name() const override { return name_; }
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    return std::unique_ptr<DraftSession>(new Session(first_));
  }

 private:
  struct Session final : DraftSession {
    explicit Session(int32_t first) : first(first) {}
    StatusOr<TokenTree> Propose(const DraftContext& ctx) override {
      TokenTree t(ctx.tokens.back());
      std::vector<int32_t> frontier{0};
      int32_t next = first;
      for (int32_t d = 0; d < std::min(ctx.shape->depth(), ctx.max_depth); ++d) {
        std::vector<int32_t> grown;
        for (int32_t parent : frontier) {
          for (int32_t k = 0; k < ctx.shape->widths[d]; ++k)
            grown.push_back(t.Propose(parent, next++ % 512, ctx.speculator_index));
        }
        frontier = std::move(grown);
      }
      return t;
    }
    int32_t first;
  };
  std::string name_;
  int32_t first_;
};

TEST(DraftSessions, MergedWideTreesStayWithinTheTreeRoomASequenceIsAdmittedWith) {
  // Two drafts of 510-node trees (1,020 merged) against a KV cache sized for one sequence at full
  // context plus one 512-node tree: the second draft is not opened, and the sequence gives the
  // plain output. Before, the merged tree overran the KV cache at the first step.
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.max_sequences = 1;
  o.speculator_factory =
      [](std::shared_ptr<const Model>,
         const Tokenizer&) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::make_unique<FullShapeSpeculator>("wide-a", 1));
    out.push_back(std::make_unique<FullShapeSpeculator>("wide-b", 256));
    return out;
  };
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  GenerateRequest r;
  r.prompt_tokens = *(*engine)->EncodePrompt("Once upon a time");
  r.max_new_tokens = 24;
  r.sampling.temperature = 0;
  auto plain = (*engine)->Generate(r);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  r.speculators = {*(*engine)->GetSpeculator("wide-a"), *(*engine)->GetSpeculator("wide-b")};
  r.tree_shape = *TreeShape::Parse("2,2,2,2,2,2,2,2");
  ASSERT_EQ(r.tree_shape.MaxNodes(), 510);
  auto speculative = (*engine)->Generate(r);
  ASSERT_TRUE(speculative.ok()) << speculative.status().ToString();
  EXPECT_EQ(speculative->tokens, plain->tokens);
  EXPECT_EQ(speculative->stats.spec.speculator_names, (std::vector<std::string>{"wide-a"}));

  // Shapes of at most half the room keep both.
  r.tree_shape = *TreeShape::Parse("2,2,2,2,2,2,2");  // 254 nodes
  auto both = (*engine)->Generate(r);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->tokens, plain->tokens);
  EXPECT_EQ(both->stats.spec.speculator_names, (std::vector<std::string>{"wide-a", "wide-b"}));
}

}  // namespace
}  // namespace specinfer
