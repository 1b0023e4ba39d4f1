// Batched drafting in the engine core (SpeculativeStep::DraftTogether): when several decoding
// sequences share a model draft, the core drafts them with one ProposeBatch per step (one draft
// pass per tree level for all), and every greedy sequence still generates exactly what plain
// incremental decoding does; seeded sampled sequences with static trees what they generate with
// per-sequence drafting.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

// layers:2 of stories260K, counting the sessions of each ProposeBatch call.
class CountingSpeculator final : public Speculator {
 public:
  explicit CountingSpeculator(std::unique_ptr<Speculator> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  StatusOr<std::unique_ptr<DraftSession>> StartSession() override {
    return inner_->StartSession();
  }
  bool batches_proposals() const override { return inner_->batches_proposals(); }
  std::vector<StatusOr<TokenTree>> ProposeBatch(std::span<DraftSession* const> sessions,
                                                std::span<const DraftContext> contexts) override {
    largest_batch = std::max(largest_batch, static_cast<int32_t>(sessions.size()));
    ++calls;
    return inner_->ProposeBatch(sessions, contexts);
  }
  int32_t largest_batch = 0;
  int32_t calls = 0;

 private:
  std::unique_ptr<Speculator> inner_;
};

std::unique_ptr<Engine> MakeEngine(int32_t max_sequences) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 2;
  o.max_sequences = max_sequences;
  o.spec_budget = SpecBudgetMode::kStatic;
  o.speculator_factory =
      [max_sequences](
          std::shared_ptr<const Model> model,
          const Tokenizer& tokenizer) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    SpeculatorOptions so;
    so.max_sequences = max_sequences;
    so.num_threads = 2;
    so.llm_tokenizer = &tokenizer;
    SI_ASSIGN_OR_RETURN(auto s, CreateSpeculator("layers:2", model, so));
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::make_unique<CountingSpeculator>(std::move(s)));
    return out;
  };
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Runs `reqs` together on an engine core; returns each one's tokens (empty on failure).
std::vector<std::vector<int32_t>> RunTogether(Engine& engine,
                                              const std::vector<GenerateRequest>& reqs,
                                              bool batch_drafts) {
  BatchOptions o;
  o.max_sequences = static_cast<int32_t>(reqs.size());
  o.max_batch_tokens = 96;
  o.spec_budget = SpecBudgetMode::kStatic;
  o.batch_drafts = batch_drafts;
  EngineCore core(engine.runner(), engine.kv(), o);
  std::vector<std::optional<StatusOr<GenerateResult>>> done(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto a = core.Add(reqs[i], nullptr,
                      [&done, i](StatusOr<GenerateResult> r) { done[i] = std::move(r); });
    EXPECT_TRUE(a.ok() && *a == EngineCore::Admission::kAdmitted) << i;
  }
  for (int steps = 0; !core.idle() && steps < 5000; ++steps) core.Step();
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(done[i].has_value() && done[i]->ok()) << "sequence " << i;
    out.push_back(done[i].has_value() && done[i]->ok() ? (*done[i])->tokens
                                                         : std::vector<int32_t>{});
  }
  return out;
}

TEST(BatchedDraftEngine, SixSequencesDraftingTogetherEqualPlainDecoding) {
  auto engine = MakeEngine(6);
  ASSERT_TRUE(engine);
  auto* draft = dynamic_cast<CountingSpeculator*>(*engine->GetSpeculator("layers:2"));
  ASSERT_NE(draft, nullptr);
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Ben went to the park. They saw",
                         "One day", "Tom had a big red ball", ""};
  std::vector<GenerateRequest> plain, spec;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r;
    r.prompt_tokens = *engine->EncodePrompt(texts[i]);
    r.max_new_tokens = 30 + 17 * i;  // different lengths: sequences end at different steps
    r.sampling.temperature = 0;
    plain.push_back(r);
    r.speculators = {draft};
    r.tree_shape = *TreeShape::Parse(i % 2 ? "2,2,1" : "1,1,1,1");
    spec.push_back(r);
  }
  std::vector<std::vector<int32_t>> want;
  for (const GenerateRequest& r : plain) {
    auto g = engine->Generate(r);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    want.push_back(g->tokens);
  }
  const auto batched = RunTogether(*engine, spec, true);
  EXPECT_GE(draft->largest_batch, 6) << "the six sequences never drafted together";
  const int32_t calls = draft->calls;
  const auto alone = RunTogether(*engine, spec, false);
  EXPECT_EQ(draft->calls, calls) << "per-sequence drafting went through ProposeBatch";
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(batched[i], want[i]) << "sequence " << i;
    EXPECT_EQ(alone[i], want[i]) << "sequence " << i;
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

// Seeded sampled sequences (static trees), one with a prompt-lookup session after the model
// draft: drafting together draws as drafting alone, so the outputs are the same.
TEST(BatchedDraftEngine, SeededSampledSequencesDrawTheSameTogether) {
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine);
  Speculator* draft = *engine->GetSpeculator("layers:2");
  Speculator* ngram = *engine->GetSpeculator("ngram:2");
  const char* texts[] = {"Once upon a time", "The cat sat", "Lily", "One day, a girl"};
  std::vector<GenerateRequest> spec;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    r.prompt_tokens = *engine->EncodePrompt(texts[i]);
    r.max_new_tokens = 40 + 9 * i;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 11 + i;
    r.speculators = {draft};
    if (i == 1) r.speculators.push_back(ngram);
    if (i == 2) r.speculators.insert(r.speculators.begin(), ngram);
    r.tree_shape = *TreeShape::Parse("2,2,1");
    spec.push_back(r);
  }
  const auto batched = RunTogether(*engine, spec, true);
  EXPECT_GE(dynamic_cast<CountingSpeculator&>(*draft).largest_batch, 2);
  const auto alone = RunTogether(*engine, spec, false);
  for (size_t i = 0; i < spec.size(); ++i) {
    EXPECT_FALSE(batched[i].empty());
    EXPECT_EQ(batched[i], alone[i]) << "sequence " << i;
  }
}

// Several drafts per sequence under node budgets (dynamic trees, and static shapes cut by a small
// room): each draft's budget depends on what the drafts before it proposed, and prompt lookup
// does not batch. Whatever DraftTogether prepares, Plan's trees (token, position and logits row
// for every node) equal those Plan drafts alone.
TEST(BatchedDraftEngine, BudgetedTreesOfSeveralDraftsEqualTheLoneOnes) {
  auto engine = MakeEngine(8);
  ASSERT_TRUE(engine);
  auto* draft = dynamic_cast<CountingSpeculator*>(*engine->GetSpeculator("layers:2"));
  ASSERT_NE(draft, nullptr);
  Speculator* ngram = *engine->GetSpeculator("ngram:2");
  const std::vector<std::vector<Speculator*>> sets = {{draft}, {ngram, draft}, {draft, ngram}};
  const char* texts[] = {"Once upon a time, there was a girl. Once upon a time, there",
                         "The cat sat on the mat. The cat sat", "Lily", "One day, a girl"};
  const TreeShape shape = *TreeShape::Parse("3,2,2,1");
  const SamplingParams greedy{.temperature = 0};
  for (bool dynamic : {true, false}) {
    for (int32_t budget : {1, 4, 9, 30}) {
      ForwardBatch planned[2];
      for (int together = 0; together < 2; ++together) {
        KvCacheManager kv(512, 16);
        std::vector<std::vector<int32_t>> tokens;
        std::vector<SpeculationStats> stats(12);
        std::vector<std::unique_ptr<SpeculativeStep>> steps;
        std::vector<Rng> rngs;
        for (int i = 0; i < 12; ++i) {
          tokens.push_back(*engine->EncodePrompt(texts[i % 4]));
          const SeqId seq = kv.AddSequence();
          ASSERT_TRUE(kv.Reserve(seq, static_cast<int32_t>(tokens.back().size())).ok());
          steps.push_back(std::make_unique<SpeculativeStep>(kv, seq, stats[i]));
          ASSERT_TRUE(steps.back()->OpenSessions(sets[i % 3], shape).ok());
          rngs.emplace_back(7);
        }
        std::vector<DraftContext> ctxs(12);
        for (int i = 0; i < 12; ++i) {
          ctxs[i].tokens = tokens[i];
          ctxs[i].shape = &shape;
          ctxs[i].max_depth = shape.depth();
          ctxs[i].sampling = &greedy;
          ctxs[i].rng = &rngs[i];
          ctxs[i].max_nodes = budget;
          ctxs[i].dynamic = dynamic;
        }
        if (together) {
          std::vector<SpeculativeStep*> all;
          for (auto& st : steps) all.push_back(st.get());
          draft->largest_batch = 0;
          SpeculativeStep::DraftTogether(all, ctxs);
          EXPECT_GE(draft->largest_batch, 4) << "the model drafts did not batch";
        }
        for (int i = 0; i < 12; ++i) {
          auto size = steps[i]->Plan(tokens[i].back(), &ctxs[i],
                                     static_cast<int32_t>(tokens[i].size()) - 1, planned[together]);
          ASSERT_TRUE(size.ok()) << size.status().ToString();
          EXPECT_LE(*size - 1, budget) << "sequence " << i;
        }
      }
      const std::string what = std::string(dynamic ? "dynamic" : "static") + " budget " +
                                std::to_string(budget);
      EXPECT_EQ(planned[1].tokens, planned[0].tokens) << what;
      EXPECT_EQ(planned[1].positions, planned[0].positions) << what;
      EXPECT_EQ(planned[1].logit_rows, planned[0].logit_rows) << what;
      EXPECT_GT(planned[0].size(), 12 + budget) << what << ": the drafts proposed (almost) nothing";
    }
  }
}

}  // namespace
}  // namespace specinfer
