// Continuous batching (engine/engine_core.h) on stories260K: many sequences of mixed lengths,
// sampling settings and speculators sharing LLM passes must each produce exactly what they
// produce alone; the token callback's logits must be those each token was chosen from; admission
// must respect the KV budget; cancellation and a failed pass must end only whom they concern.
#include "engine/engine_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "engine/engine.h"
#include "test_util.h"

namespace specinfer {
namespace {

// Static trees unless a test asks for the adaptive controller: with it a step's tree depends on
// measured costs, so a seeded sampled sequence draws differently alone than in a batch (each is
// distributed exactly, but not the same draws); greedy ones are the same token for token.
std::unique_ptr<Engine> MakeEngine(int32_t max_sequences,
                                   SpecBudgetMode budget = SpecBudgetMode::kStatic) {
  EngineOptions o;
  o.spec_budget = budget;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.max_sequences = max_sequences;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Outcome {
  std::optional<StatusOr<GenerateResult>> done;
  std::vector<int32_t> streamed;
  int32_t without_logits = 0;  // tokens streamed with an empty logits row
};

// Adds `req` to `batch`, recording what it streams and how it ends into `out`.
EngineCore::Admission AddTo(EngineCore& batch, const GenerateRequest& req, Outcome& out) {
  auto a = batch.Add(
      req,
      [&out](int32_t t, std::span<const float> logits) {
        out.streamed.push_back(t);
        out.without_logits += logits.empty() ? 1 : 0;
        return true;
      },
      [&out](StatusOr<GenerateResult> r) { out.done = std::move(r); });
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : EngineCore::Admission::kNoRoom;
}

// 32 requests of mixed prompt lengths, lengths, sampling settings and speculators, all admitted
// at once and run with a small token budget (so prefill chunks and token trees share passes):
// each one's tokens equal its tokens when generated alone.
// With `budget` kAuto, only greedy sequences are compared with their run alone (see MakeEngine),
// and the sampled ones of the mix become greedy. Half the greedy sequences read no logits in the
// batch (GenerateRequest::callback_logits false): their passes bring back argmax rows beside the
// others' logits rows, and they must still equal their runs alone, which read logits. So do the
// sampled sequences without speculators that read no logits, whose tokens the runner draws
// (ForwardBatch::draws) at uniforms taken before the pass instead of after it.
void ExpectThirtyTwoMixedSequencesEachEqualAlone(SpecBudgetMode budget) {
  const bool adaptive = budget == SpecBudgetMode::kAuto;
  auto engine = MakeEngine(32, budget);
  ASSERT_TRUE(engine);
  const std::vector<std::string> texts = {
      "", "Once", "Once upon a time", "The cat sat on the mat and looked at the bird",
      "Lily and Ben went to the park. They saw a big dog. The dog was happy and ran to them.",
      "One day"};
  std::mt19937 rng(7);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    GenerateRequest r;
    r.prompt_tokens = *engine->EncodePrompt(texts[i % texts.size()]);
    r.max_new_tokens = 5 + static_cast<int32_t>(rng() % 80);
    r.stop_tokens = engine->default_stop_tokens();
    if ((adaptive && i % 3 != 1) || i % 3 == 0) r.sampling.temperature = 0;
    if (i % 3 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 100 + i;
    }
    switch (i % 4) {
      case 1:
        r.speculators = {*engine->GetSpeculator("ngram")};
        r.tree_shape = *TreeShape::Parse("1,1,1");
        break;
      case 2:
        r.speculators = {*engine->GetSpeculator("layers:3"), *engine->GetSpeculator("ngram:2")};
        r.tree_shape = *TreeShape::Parse("2,1,2");
        break;
      case 3:
        r.speculators = {*engine->GetSpeculator("layers:2")};
        r.tree_shape = *TreeShape::Parse("1,1,3,1");
        break;
      default:
        break;  // incremental decoding
    }
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const GenerateRequest& r : reqs) {
    auto g = engine->Generate(r);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    alone.push_back(g->tokens);
  }

  BatchOptions o;
  o.max_sequences = 32;
  o.max_batch_tokens = 48;
  o.spec_budget = budget;
  EngineCore batch(engine->runner(), engine->kv(), o);
  std::vector<Outcome> out(reqs.size());
  int32_t argmax_sequences = 0;
  int32_t drawn_sequences = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].sampling.greedy() && i % 2 == 0) {
      reqs[i].callback_logits = false;
      ++argmax_sequences;
    }
    if (!reqs[i].sampling.greedy() && reqs[i].speculators.empty() && i % 2 == 0) {
      reqs[i].callback_logits = false;  // its tokens are drawn by the runner (ForwardBatch::draws)
      ++drawn_sequences;
    }
    ASSERT_EQ(AddTo(batch, reqs[i], out[i]), EngineCore::Admission::kAdmitted) << i;
  }
  EXPECT_GE(argmax_sequences, 5);
  EXPECT_GE(drawn_sequences, 2);
  int32_t steps = 0, peak = 0;
  while (!batch.idle() && steps < 10000) {
    peak = std::max(peak, batch.num_running());
    batch.Step();
    ++steps;
  }
  EXPECT_EQ(peak, 32);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(out[i].done.has_value()) << i;
    ASSERT_TRUE(out[i].done->ok()) << i << ": " << out[i].done->status().ToString();
    if (adaptive && reqs[i].sampling.temperature != 0 && !reqs[i].speculators.empty()) {
      EXPECT_EQ(out[i].streamed, (*out[i].done)->tokens) << "sequence " << i;
      continue;
    }
    EXPECT_EQ((*out[i].done)->tokens, alone[i]) << "sequence " << i;
    EXPECT_EQ(out[i].streamed, alone[i]) << "sequence " << i;
    EXPECT_EQ(out[i].without_logits,
              reqs[i].callback_logits ? 0 : static_cast<int32_t>(out[i].streamed.size()))
        << "sequence " << i;
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
  EXPECT_EQ(batch.reserved_kv_blocks(), 0);
}

TEST(EngineCore, ThirtyTwoMixedSequencesEachEqualAlone) {
  ExpectThirtyTwoMixedSequencesEachEqualAlone(SpecBudgetMode::kStatic);
}

// The adaptive controller (engine/spec_controller.h) calibrates with 32 sequences holding KV and
// cuts trees by the batch: greedy sequences still equal their runs alone token for token.
TEST(EngineCore, AdaptiveThirtyTwoMixedGreedySequencesEachEqualAlone) {
  ExpectThirtyTwoMixedSequencesEachEqualAlone(SpecBudgetMode::kAuto);
}

// Each token arrives with the logits row it was chosen from: the logits after the prompt and the
// tokens before it. Speculative steps emit several tokens per pass (each from its parent node's
// row), so this checks the row bookkeeping of accepted paths too.
TEST(EngineCore, TokenLogitsAreThoseOfEachPrefix) {
  auto engine = MakeEngine(2);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model().config().vocab_size;
  for (bool speculate : {false, true}) {
    for (float temperature : {0.0f, 1.0f}) {
      GenerateRequest req;
      req.prompt_tokens = *engine->EncodePrompt("Once upon a time, there was a big dog");
      req.max_new_tokens = 40;
      req.sampling.temperature = temperature;
      req.sampling.seed = 3;
      if (speculate) {
        req.speculators = {*engine->GetSpeculator("layers:3"), *engine->GetSpeculator("ngram:1")};
        req.tree_shape = *TreeShape::Parse("2,2,1");
      }
      std::vector<int32_t> tokens;
      std::vector<std::vector<float>> rows;
      auto r = engine->Generate(req, [&](int32_t t, std::span<const float> logits) {
        tokens.push_back(t);
        rows.emplace_back(logits.begin(), logits.end());
        return true;
      });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(tokens.size(), 40u);
      if (speculate) {
        EXPECT_GT(r->stats.tokens_per_pass(), 1.0);
      }
      std::vector<int32_t> prefix = req.prompt_tokens;
      for (size_t i = 0; i < tokens.size(); ++i) {
        const std::vector<float> want = testing::PromptLogits(
            engine->runner(), engine->kv(), prefix, {static_cast<int32_t>(prefix.size()) - 1});
        ASSERT_EQ(rows[i].size(), static_cast<size_t>(vocab));
        float worst = 0;
        for (int32_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(rows[i][v] - want[v]));
        // The prompt's KV may come from the BLAS prefill in one and the batch-invariant kernels
        // in the other: equal up to float rounding.
        EXPECT_LT(worst, 1e-4f) << "spec=" << speculate << " T=" << temperature << " token " << i;
        if (temperature == 0) {
          EXPECT_EQ(std::max_element(rows[i].begin(), rows[i].end()) - rows[i].begin(), tokens[i])
              << "greedy picks the argmax of its row, token " << i;
        }
        prefix.push_back(tokens[i]);
      }
    }
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

TEST(EngineCore, AdmissionWaitsForKvRoom) {
  auto engine = MakeEngine(1);
  ASSERT_TRUE(engine);
  // 24 blocks of 16 positions: room for one 200-token sequence (13 blocks) at a time.
  KvCacheManager kv(24, engine->kv().block_size());
  EngineCore batch(engine->runner(), kv, BatchOptions{});
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 200;
  Outcome a, b;
  ASSERT_EQ(AddTo(batch, req, a), EngineCore::Admission::kAdmitted);
  EXPECT_EQ(AddTo(batch, req, b), EngineCore::Admission::kNoRoom);
  EXPECT_FALSE(b.done.has_value());
  // One that could never fit is refused outright.
  GenerateRequest huge = req;
  huge.max_new_tokens = 500;
  auto refused = batch.Add(huge, nullptr, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  while (!a.done) batch.Step();
  ASSERT_TRUE(a.done->ok());
  ASSERT_EQ(AddTo(batch, req, b), EngineCore::Admission::kAdmitted);
  while (!b.done) batch.Step();
  ASSERT_TRUE(b.done->ok());
  EXPECT_EQ((*b.done)->tokens, (*a.done)->tokens);
  EXPECT_EQ(kv.used_blocks(), 0);
}

TEST(EngineCore, CancelPollEndsASequenceStillInPrefill) {
  auto engine = MakeEngine(2);
  ASSERT_TRUE(engine);
  BatchOptions o;
  o.max_batch_tokens = 8;  // a 100-token prompt takes many passes
  EngineCore batch(engine->runner(), engine->kv(), o);
  GenerateRequest req;
  for (int i = 0; i < 100; ++i) req.prompt_tokens.push_back(1 + (i * 37) % 500);
  req.max_new_tokens = 10;
  bool cancel = false;
  Outcome out;
  auto a = batch.Add(
      req, [&](int32_t t, std::span<const float>) { out.streamed.push_back(t); return true; },
      [&](StatusOr<GenerateResult> r) { out.done = std::move(r); }, [&] { return cancel; });
  ASSERT_TRUE(a.ok());
  batch.Step();
  batch.Step();
  EXPECT_GT(engine->kv().used_blocks(), 0);
  cancel = true;
  batch.Step();
  ASSERT_TRUE(out.done.has_value());
  ASSERT_TRUE(out.done->ok());
  EXPECT_EQ((*out.done)->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(out.streamed.empty());
  EXPECT_TRUE(batch.idle());
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

// A runner that runs `inner`; the test runners below change what they need.
class DelegatingRunner : public ModelRunner {
 public:
  explicit DelegatingRunner(ModelRunner& inner) : inner_(inner) {}
  const Model& model() const override { return inner_.model(); }
  Status Forward(const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l) override {
    return inner_.Forward(b, kv, l);
  }
  Status MoveKv(const KvCacheManager& kv, SeqId s, std::span<const int32_t> src,
                std::span<const int32_t> dst) override {
    return inner_.MoveKv(kv, s, src, dst);
  }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }

 private:
  ModelRunner& inner_;
};

// A runner that fails its N-th forward pass (counting from 1), else runs the real one.
class FailingRunner final : public DelegatingRunner {
 public:
  FailingRunner(ModelRunner& inner, int fail_at) : DelegatingRunner(inner), fail_at_(fail_at) {}
  std::string name() const override { return "failing"; }
  Status Forward(const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l) override {
    if (++calls_ == fail_at_) return InternalError("injected failure");
    return DelegatingRunner::Forward(b, kv, l);
  }

 private:
  int fail_at_;
  int calls_ = 0;
};

// A runner that asks for `warmup` untimed passes of each new shape (ModelRunner::warmup_passes)
// and records the size of every cost-calibration pass (a chain of token 0s with every row's
// logits); else it runs the real one.
class CalibrationRecorder final : public DelegatingRunner {
 public:
  CalibrationRecorder(ModelRunner& inner, int32_t warmup)
      : DelegatingRunner(inner), warmup_(warmup) {}
  std::string name() const override { return "calibration-recorder"; }
  Status Forward(const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l) override {
    const bool calibration =
        b.logit_rows.size() == b.tokens.size() &&
        std::all_of(b.tokens.begin(), b.tokens.end(), [](int32_t t) { return t == 0; });
    if (calibration) calibration_sizes.push_back(b.size());
    return DelegatingRunner::Forward(b, kv, l);
  }
  int32_t warmup_passes() const override { return warmup_; }

  std::vector<int32_t> calibration_sizes;

 private:
  int32_t warmup_;
};

// The adaptive controller's cost calibration times each size's steady pass: one warm-up pass of
// the model, then per size the runner's warm-up passes of that shape before the timed one (a
// CUDA runner with graphs: the capture is not timed, the first replay is).
TEST(EngineCore, CalibrationTimesEachShapeAfterTheRunnersWarmUpPasses) {
  auto engine = MakeEngine(4, SpecBudgetMode::kAuto);
  ASSERT_TRUE(engine);
  for (int32_t warmup : {0, 2}) {
    CalibrationRecorder runner(engine->runner(), warmup);
    BatchOptions o;
    o.spec_budget = SpecBudgetMode::kAuto;
    o.max_batch_tokens = 128;
    EngineCore batch(runner, engine->kv(), o);
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
    req.max_new_tokens = 8;
    req.sampling.temperature = 0;
    req.speculators = {*engine->GetSpeculator("ngram")};
    req.tree_shape = *TreeShape::Parse("1,1,1");
    Outcome out;
    ASSERT_EQ(AddTo(batch, req, out), EngineCore::Admission::kAdmitted);
    while (!out.done) batch.Step();
    ASSERT_TRUE(out.done->ok()) << out.done->status().ToString();
    std::vector<int32_t> want = {1};
    for (int32_t t : {1, 2, 3, 5, 9, 17, 33, 65})
      for (int32_t i = 0; i <= warmup; ++i) want.push_back(t);
    EXPECT_EQ(runner.calibration_sizes, want) << "warm-up passes " << warmup;
  }
}

// A runner that takes distribution rows (ModelRunner::returns_distributions, as a GPU runner
// does) and fills them on the host (the default ForwardArgmax), counting them.
class DistributionRunner final : public DelegatingRunner {
 public:
  using DelegatingRunner::DelegatingRunner;
  std::string name() const override { return "distributions"; }
  bool returns_distributions() const override { return true; }
  Status ForwardArgmax(const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l,
                       std::span<int32_t> a, DistRows* d) override {
    dist_rows += static_cast<int64_t>(b.dist_rows.size());
    logit_rows += static_cast<int64_t>(b.logit_rows.size());
    return ModelRunner::ForwardArgmax(b, kv, l, a, d);
  }
  int64_t dist_rows = 0, logit_rows = 0;
};

// Sampled speculative sequences that read no logits get their trees back as distribution rows,
// verified from those: three of them batched together (each tree's rows at its own offset among
// the pass's) equal their runs alone through logits rows token for token, under temperature,
// top-p and top-k, and no logits row crosses.
TEST(EngineCore, SampledTreesVerifiedFromDistributionRowsEqualLogitsRows) {
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine);
  DistributionRunner runner(engine->runner());
  BatchOptions o;
  o.spec_budget = SpecBudgetMode::kStatic;  // whole trees, as the engine's runs alone
  EngineCore batch(runner, engine->kv(), o);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const std::vector<Case> cases = {{1.0f, 0, 1.0f}, {0.8f, 0, 0.9f}, {1.2f, 20, 0.95f}};
  std::vector<GenerateRequest> reqs;
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt(i == 1 ? "Once upon a time, there was a big dog"
                                                     : "Once upon a time");
    req.max_new_tokens = 40;
    req.sampling.temperature = cases[i].temperature;
    req.sampling.top_k = cases[i].top_k;
    req.sampling.top_p = cases[i].top_p;
    req.sampling.seed = 17 + i;
    req.speculators = {*engine->GetSpeculator("layers:3"), *engine->GetSpeculator("ngram:1")};
    req.tree_shape = *TreeShape::Parse("2,2,1");
    req.callback_logits = false;
    reqs.push_back(req);
  }
  std::vector<Outcome> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_EQ(AddTo(batch, reqs[i], out[i]), EngineCore::Admission::kAdmitted) << i;
  while (!batch.idle()) batch.Step();
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerateRequest alone = reqs[i];
    alone.callback_logits = true;  // logits rows on the engine's own runner
    auto want = engine->Generate(alone);
    ASSERT_TRUE(want.ok() && out[i].done && out[i].done->ok()) << i;
    EXPECT_EQ((*out[i].done)->tokens, want->tokens) << "request " << i;
    EXPECT_GT((*out[i].done)->stats.spec.accepted_tokens, 0) << "request " << i;
    EXPECT_EQ(out[i].without_logits, static_cast<int32_t>(want->tokens.size())) << i;
  }
  EXPECT_GT(runner.dist_rows, 100);
  EXPECT_EQ(runner.logit_rows, 0) << "decode steps brought back logits rows";
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

TEST(EngineCore, AFailedPassFailsItsSequencesAndServingGoesOn) {
  auto engine = MakeEngine(4);
  ASSERT_TRUE(engine);
  FailingRunner runner(engine->runner(), /*fail_at=*/3);
  EngineCore batch(runner, engine->kv(), BatchOptions{});
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 20;
  auto want = engine->Generate(req);
  ASSERT_TRUE(want.ok());
  Outcome a, b, c;
  AddTo(batch, req, a);
  AddTo(batch, req, b);
  batch.Step();
  batch.Step();
  batch.Step();  // the failing pass
  ASSERT_TRUE(a.done && b.done);
  EXPECT_EQ(a.done->status().code(), StatusCode::kInternal);
  EXPECT_NE(a.done->status().message().find("injected"), std::string::npos);
  EXPECT_EQ(b.done->status().code(), StatusCode::kInternal);
  EXPECT_EQ(engine->kv().used_blocks(), 0);
  ASSERT_EQ(AddTo(batch, req, c), EngineCore::Admission::kAdmitted);
  while (!c.done) batch.Step();
  ASSERT_TRUE(c.done->ok()) << c.done->status().ToString();
  EXPECT_EQ((*c.done)->tokens, want->tokens);
}

TEST(EngineCore, InvalidRequestIsRefusedAtAdd) {
  auto engine = MakeEngine(1);
  ASSERT_TRUE(engine);
  EngineCore batch(engine->runner(), engine->kv(), BatchOptions{});
  GenerateRequest req;
  req.prompt_tokens = {1, 99999};
  auto a = batch.Add(req, nullptr, nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(batch.idle());
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specinfer
