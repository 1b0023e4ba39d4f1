// Speculative generation end to end: tree attention equals ordinary decoding node by node,
// greedy speculative output equals incremental output token for token for every speculator kind
// and tree shape, sampled output has the LLM's distribution, and bad speculation settings are
// refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>

#include "backend/cpu/cpu_runner.h"
#include "common/mapped_file.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "model/loader.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

// A draft for stories260K: its weights, each scaled by a random factor in [1 - noise, 1 + noise]
// (same vocabulary, similar but not equal predictions), written as a llama2.c checkpoint.
std::string PerturbedStories260K(float noise) {
  static std::map<float, std::string> made;
  if (auto it = made.find(noise); it != made.end()) return it->second;
  auto bytes = ReadFileToString(testing::Stories260KModel());
  EXPECT_TRUE(bytes.ok());
  std::string data = *bytes;
  const size_t header = 7 * sizeof(int32_t);
  uint64_t state = 42;
  for (size_t off = header; off + 4 <= data.size(); off += 4) {
    float w;
    std::memcpy(&w, data.data() + off, 4);
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(state >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    w *= 1.0f + noise * (2 * u - 1);
    std::memcpy(data.data() + off, &w, 4);
  }
  const auto path = testing::ScratchDir("draft" + std::to_string(static_cast<int>(noise * 100))) /
                    "draft.bin";
  testing::WriteFile(path, data);
  return made[noise] = path.string();
}

// The tests here check the full tree shapes they ask for (SpecBudgetMode::kStatic) unless they
// say otherwise; the adaptive ones at the end pass kAuto.
std::unique_ptr<Engine> MakeEngine(const std::string& model, const std::string& tokenizer,
                                   std::vector<std::string> drafts = {},
                                   SpecBudgetMode budget = SpecBudgetMode::kStatic,
                                   int32_t max_sequences = 1) {
  EngineOptions o;
  o.max_sequences = max_sequences;
  o.spec_budget = budget;
  o.model_path = model;
  o.tokenizer_path = tokenizer;
  o.num_threads = 2;
  o.drafts = std::move(drafts);
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::unique_ptr<Engine> Stories(std::vector<std::string> drafts = {},
                                SpecBudgetMode budget = SpecBudgetMode::kStatic) {
  return MakeEngine(testing::Stories260KModel(), testing::Stories260KTokenizer(),
                    std::move(drafts), budget);
}

// --- Tree attention ---

// The logits of one pass over a token tree equal, at every node, those of feeding the node's
// root-to-node sequence token by token (bit for bit: the kernels are batch-invariant).
TEST(TreeAttention, EveryNodeMatchesOrdinaryDecodingOfItsPath) {
  auto engine = Stories();
  ASSERT_TRUE(engine);
  const std::vector<int32_t> prompt = *engine->EncodePrompt("Once upon a time, a cat");
  ModelRunner& runner = engine->runner();
  KvCacheManager& kv = engine->kv();
  const int32_t vocab = engine->model().config().vocab_size;

  // A tree of 3 levels with mixed widths over arbitrary tokens; the root is the prompt's last.
  TokenTree tree(prompt.back());
  const int32_t a = tree.Propose(0, 33, 0), b = tree.Propose(0, 400, 0);
  const int32_t a1 = tree.Propose(a, 7, 0), a2 = tree.Propose(a, 120, 0);
  tree.Propose(a1, 301, 0);
  tree.Propose(a2, 45, 0);
  tree.Propose(b, 33, 0);
  std::vector<int32_t> order, parents;
  tree.DepthFirstLayout(&order, &parents);
  const TreeMask mask = TreeMask::FromParents(parents);
  const int32_t committed = static_cast<int32_t>(prompt.size()) - 1;

  const SeqId seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(seq, committed + tree.size()).ok());
  std::vector<float> unused(vocab);
  {
    ForwardBatch pre;
    std::vector<int32_t> pos(committed);
    std::iota(pos.begin(), pos.end(), 0);
    pre.AddSequence(seq, std::span(prompt).first(committed), pos, 0, nullptr);
    ASSERT_TRUE(runner.Forward(pre, kv, unused).ok());
  }
  ForwardBatch batch;
  std::vector<int32_t> toks, pos;
  for (int32_t v : order) {
    toks.push_back(tree.node(v).token);
    pos.push_back(committed + tree.node(v).depth);
  }
  batch.AddSequence(seq, toks, pos, committed, &mask);
  batch.logit_rows.resize(order.size());
  std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), 0);
  std::vector<float> logits(order.size() * vocab);
  ASSERT_TRUE(runner.Forward(batch, kv, logits).ok());
  kv.RemoveSequence(seq);

  for (size_t i = 0; i < order.size(); ++i) {
    std::vector<int32_t> path = prompt;
    for (int32_t t : tree.TokensTo(order[i])) path.push_back(t);
    // Ordinary decoding: prefill the prompt but its last token, then one token per pass.
    const SeqId s = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(s, static_cast<int32_t>(path.size())).ok());
    ForwardBatch pre;
    std::vector<int32_t> ppos(committed);
    std::iota(ppos.begin(), ppos.end(), 0);
    pre.AddSequence(s, std::span(path).first(committed), ppos, 0, nullptr);
    ASSERT_TRUE(runner.Forward(pre, kv, unused).ok());
    std::vector<float> want(vocab);
    for (int32_t p = committed; p < static_cast<int32_t>(path.size()); ++p) {
      ForwardBatch step;
      step.AddSequence(s, std::span(&path[p], 1), std::span(&p, 1), p, nullptr);
      step.logit_rows = {0};
      ASSERT_TRUE(runner.Forward(step, kv, want).ok());
    }
    kv.RemoveSequence(s);
    EXPECT_EQ(0, std::memcmp(want.data(), &logits[i * vocab], vocab * sizeof(float)))
        << "node at layout position " << i << " (depth " << tree.node(order[i]).depth << ")";
  }
}

// A draft grows its tree one level per pass: each level's tokens see the committed prefix and,
// through the mask, only their own ancestors among the earlier levels' cache entries.
TEST(TreeAttention, LevelByLevelPassesWithMaskedCacheEntriesMatchOneTreePass) {
  auto engine = Stories();
  ASSERT_TRUE(engine);
  ModelRunner& runner = engine->runner();
  KvCacheManager& kv = engine->kv();
  const int32_t vocab = engine->model().config().vocab_size;
  const std::vector<int32_t> prefix = *engine->EncodePrompt("The dog");
  const int32_t n = static_cast<int32_t>(prefix.size());
  // Level 1: tokens 10, 20 (children of the prefix's last token); level 2: 11 under 10, 21 and
  // 22 under 20.
  const SeqId seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(seq, n + 5).ok());
  std::vector<float> logits(3 * vocab);
  {
    ForwardBatch pre;
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    pre.AddSequence(seq, prefix, pos, 0, nullptr);
    ASSERT_TRUE(runner.Forward(pre, kv, logits).ok());
  }
  {
    const TreeMask m1 = TreeMask::FromParents(std::vector<int32_t>{-1, -1});
    ForwardBatch l1;
    l1.AddSequence(seq, std::vector<int32_t>{10, 20}, std::vector<int32_t>{n, n}, n, &m1);
    ASSERT_TRUE(runner.Forward(l1, kv, logits).ok());
  }
  TreeMask m2 = TreeMask::Empty(3, 5);  // window: [10, 20 | 11, 21, 22]
  m2.Set(0, 0), m2.Set(0, 2);
  m2.Set(1, 1), m2.Set(1, 3);
  m2.Set(2, 1), m2.Set(2, 4);
  ForwardBatch l2;
  l2.AddSequence(seq, std::vector<int32_t>{11, 21, 22}, std::vector<int32_t>{n + 1, n + 1, n + 1},
                 n, &m2, /*masked_kv=*/2);
  l2.logit_rows = {0, 1, 2};
  ASSERT_TRUE(runner.Forward(l2, kv, logits).ok());
  kv.RemoveSequence(seq);

  const std::vector<std::vector<int32_t>> paths = {{10, 11}, {20, 21}, {20, 22}};
  for (size_t i = 0; i < paths.size(); ++i) {
    std::vector<int32_t> seqtoks = prefix;
    seqtoks.insert(seqtoks.end(), paths[i].begin(), paths[i].end());
    const std::vector<float> want = testing::PromptLogits(
        runner, kv, seqtoks, {static_cast<int32_t>(seqtoks.size()) - 1});
    float max_diff = 0;
    for (int32_t j = 0; j < vocab; ++j)
      max_diff = std::max(max_diff, std::abs(want[j] - logits[i * vocab + j]));
    EXPECT_LT(max_diff, 1e-4f) << "path " << i;
  }
}

// --- Greedy exactness ---

struct Case {
  std::string label;
  std::vector<std::string> drafts;
  std::string shape;
};

void ExpectGreedyEqualsIncremental(Engine& engine, const std::vector<std::string>& prompts,
                                   const std::vector<Case>& cases, int32_t max_tokens) {
  for (const std::string& prompt : prompts) {
    GenerateRequest req;
    req.prompt_tokens = *engine.EncodePrompt(prompt);
    req.max_new_tokens = max_tokens;
    req.sampling.temperature = 0;
    req.stop_tokens = engine.default_stop_tokens();
    auto base = engine.Generate(req);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    EXPECT_EQ(base->stats.decode_passes, base->stats.generated_tokens);
    for (const Case& c : cases) {
      SCOPED_TRACE("prompt '" + prompt + "', " + c.label + ", tree " + c.shape);
      GenerateRequest sreq = req;
      sreq.tree_shape = *TreeShape::Parse(c.shape);
      for (const std::string& d : c.drafts) {
        auto s = engine.GetSpeculator(d);
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        sreq.speculators.push_back(*s);
      }
      auto r = engine.Generate(sreq);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->tokens, base->tokens);
      EXPECT_EQ(r->finish_reason, base->finish_reason);
      // Statistics add up.
      const SpeculationStats& sp = r->stats.spec;
      EXPECT_LE(r->stats.generated_tokens, r->stats.decode_passes + sp.accepted_tokens);
      EXPECT_EQ(std::accumulate(sp.accepted_at_depth.begin(), sp.accepted_at_depth.end(),
                                int64_t{0}),
                sp.accepted_tokens);
      EXPECT_LE(sp.accepted_tokens, sp.tree_nodes);
      ASSERT_EQ(sp.accepted_by.size(), c.drafts.size());
    }
  }
  EXPECT_EQ(engine.kv().used_blocks(), 0) << "a sequence kept KV blocks after generation";
}

const std::vector<std::string> kShapes = {"1", "1,1,1,1,1,1", "4,1,1", "1,1,3,1,1,1,1,1",
                                          "2,2,2"};

TEST(SpeculativeGreedy, EqualsIncrementalForEverySpeculatorAndShapeOnStories260K) {
  const std::string draft = "model:" + PerturbedStories260K(0.3f);
  auto engine = Stories({draft, "model:" + testing::Stories260KModel()});
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  for (const std::string& shape : kShapes) {
    cases.push_back({"ngram", {"ngram"}, shape});
    cases.push_back({"ngram:1", {"ngram:1"}, shape});
    cases.push_back({"layers:2", {"layers:2"}, shape});
    cases.push_back({"layers:4", {"layers:4"}, shape});
    cases.push_back({"perturbed draft model", {draft}, shape});
    cases.push_back({"itself as draft", {"model:" + testing::Stories260KModel()}, shape});
    cases.push_back({"merged", {"ngram", draft, "layers:3"}, shape});
  }
  ExpectGreedyEqualsIncremental(
      *engine, {"", "Once upon a time", "Lily and Ben went to the park. Lily and Ben", "The sun"},
      cases, 120);
}

TEST(SpeculativeGreedy, EqualsIncrementalOnSmolLM2) {
  const std::string model = testing::DefaultModel();
  if (model.empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh places it)";
  auto engine = MakeEngine(model, "", {"model:" + model});
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  for (const char* shape : {"1,1,1,1,1,1", "1,1,3,1,1,1,1,1"}) {
    cases.push_back({"ngram", {"ngram"}, shape});
    cases.push_back({"layers:20", {"layers:20"}, shape});
    cases.push_back({"itself as draft", {"model:" + model}, shape});
  }
  cases.push_back({"merged", {"ngram", "layers:24"}, "2,1,1,1"});
  ExpectGreedyEqualsIncremental(
      *engine,
      {"The capital of France is",
       "Rewrite in plain words: The committee has decided that the meeting will be postponed "
       "until further notice. Rewritten:"},
      cases, 40);
}

TEST(SpeculativeGreedy, ADraftThatAgreesIsAcceptedAlmostEverywhere) {
  auto engine = Stories({"model:" + testing::Stories260KModel()});
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 100;
  req.sampling.temperature = 0;
  req.speculators = engine->speculators();
  req.tree_shape = TreeShape::Chain(6);
  auto r = engine->Generate(req);
  ASSERT_TRUE(r.ok());
  // The model drafting for itself guesses every token, so each pass yields 7.
  EXPECT_GE(r->stats.tokens_per_pass(), 6.5);
  EXPECT_EQ(r->stats.spec.accepted_by[0], r->stats.spec.accepted_tokens);
}

// --- Distribution exactness, end to end ---

// The LLM, its prompt and the speculators of a statistical test (stories260K by default).
struct SampledSetup {
  std::string llm;  // model path; empty: stories260K
  std::string prompt = "Lily saw a";
  bool chat = false;  // `prompt` is a user message, rendered with the model's chat template
  std::string tree = "2,2,1";
  bool with_ngram = true;  // merge an ngram:1 draft in too
  // Sequences generated side by side on an engine core (prompt KV from its prefix cache, one
  // draft pass per level for all); 1: one at a time through Engine::Generate.
  int32_t batch = 1;
};

// Generates with sampling and speculation many times, keeping the first two tokens, and
// compares their frequencies with the LLM's own probabilities (computed from its logits).
// Cells with fewer than 20 expected draws are pooled.
void ExpectSampledTokensFollowTheLlm(const SamplingParams& sampling, int64_t n,
                                     SpecBudgetMode budget = SpecBudgetMode::kStatic,
                                     std::string draft = "", const SampledSetup& setup = {}) {
  if (draft.empty()) draft = "model:" + PerturbedStories260K(0.3f);
  const std::string llm_path = setup.llm.empty() ? testing::Stories260KModel() : setup.llm;
  auto engine = setup.llm.empty() ? Stories({draft}, budget)
                                  : MakeEngine(llm_path, "", {draft}, budget, setup.batch);
  ASSERT_TRUE(engine);
  std::vector<int32_t> prompt;
  if (setup.chat) {
    const std::vector<ChatMessage> messages = {{"user", setup.prompt}};
    std::vector<int32_t> stops;
    auto encoded = engine->EncodeChat(messages, "", &stops);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    prompt = *encoded;
  } else {
    prompt = *engine->EncodePrompt(setup.prompt);
  }
  auto model = LoadModel(llm_path);
  ASSERT_TRUE(model.ok());
  std::shared_ptr<const Model> llm(std::move(model).value());
  const int32_t vocab = llm->config().vocab_size;

  std::vector<float> p1, p2;
  ComputeProbs(testing::LastLogits(llm, prompt), sampling, p1);
  std::vector<double> second(vocab, 0.0);
  for (int32_t a = 0; a < vocab; ++a) {
    if (p1[a] == 0) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    ComputeProbs(testing::LastLogits(llm, ctx), sampling, p2);
    for (int32_t b = 0; b < vocab; ++b) second[b] += static_cast<double>(p1[a]) * p2[b];
  }

  std::vector<int64_t> c1(vocab, 0), c2(vocab, 0);
  GenerateRequest req;
  req.prompt_tokens = prompt;
  req.max_new_tokens = 8;
  req.sampling = sampling;
  req.speculators = {*engine->GetSpeculator(draft)};
  if (setup.with_ngram) req.speculators.push_back(*engine->GetSpeculator("ngram:1"));
  req.tree_shape = *TreeShape::Parse(setup.tree);
  int64_t accepted = 0, passes = 0;
  auto record = [&](const std::vector<int32_t>& got, const StatusOr<GenerateResult>& r) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(got.size(), 2u);
    ++c1[got[0]];
    ++c2[got[1]];
    accepted += r->stats.spec.accepted_tokens;
    passes += r->stats.decode_passes;
  };
  if (setup.batch <= 1) {
    for (int64_t i = 0; i < n; ++i) {
      req.sampling.seed = 1000 + i;
      std::vector<int32_t> got;
      auto r = engine->Generate(req, [&](int32_t t, std::span<const float>) {
        got.push_back(t);
        return got.size() < 2;
      });
      record(got, r);
      if (::testing::Test::HasFatalFailure()) return;
    }
  } else {
    BatchOptions o;
    o.max_sequences = setup.batch;
    o.spec_budget = budget;
    EngineCore core(engine->runner(), engine->kv(), o);
    std::vector<std::vector<int32_t>> got(static_cast<size_t>(n));
    int64_t next = 0, finished = 0;
    while (finished < n) {
      while (next < n && core.num_running() < setup.batch) {
        const size_t i = static_cast<size_t>(next);
        req.sampling.seed = 1000 + next++;
        auto a = core.Add(
            req,
            [&got, i](int32_t t, std::span<const float>) {
              got[i].push_back(t);
              return got[i].size() < 2;
            },
            [&, i](StatusOr<GenerateResult> r) {
              record(got[i], r);
              ++finished;
            });
        ASSERT_TRUE(a.ok() && *a == EngineCore::Admission::kAdmitted);
      }
      core.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("  %lld draft tokens accepted in %lld passes\n", static_cast<long long>(accepted),
              static_cast<long long>(passes));
  if (budget == SpecBudgetMode::kStatic) {
    EXPECT_GT(accepted, passes / 4) << "the draft is accepted too rarely to test anything";
  } else {
    // The controller's choice depends on earlier draws; what matters is that it speculated.
    std::printf("  adaptive: %lld accepted tokens in %lld passes\n",
                static_cast<long long>(accepted), static_cast<long long>(passes));
    // Under a heavy load it may speculate on little more than its probes (1 step in 16).
    EXPECT_GT(accepted, passes / 100) << "the controller hardly speculated: nothing tested";
  }

  auto check = [&](const std::vector<double>& p, const std::vector<int64_t>& c, const char* what) {
    double pooled_p = 0, max_z = 0;
    int64_t pooled_c = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      if (p[t] == 0) {
        EXPECT_EQ(c[t], 0) << what << ": token " << t << " has probability 0";
        continue;
      }
      if (n * p[t] < 20) {
        pooled_p += p[t];
        pooled_c += c[t];
        continue;
      }
      max_z = std::max(max_z, std::abs(c[t] - n * p[t]) / std::sqrt(n * p[t] * (1 - p[t])));
    }
    if (pooled_p > 0)
      max_z = std::max(max_z, std::abs(pooled_c - n * pooled_p) /
                                  std::sqrt(n * pooled_p * (1 - pooled_p)));
    std::printf("  %s token: %lld samples, max |z| = %.2f\n", what, static_cast<long long>(n),
                max_z);
    EXPECT_LT(max_z, 5) << what << " token's distribution differs from the LLM's";
  };
  std::vector<double> first(p1.begin(), p1.end());
  check(first, c1, "first");
  check(second, c2, "second");
}

TEST(SpeculativeSampling, FirstAndSecondTokensFollowTheLlmAtTemperatureOne) {
  SamplingParams s;
  s.temperature = 1.0f;
  ExpectSampledTokensFollowTheLlm(s, 20000);
}

TEST(SpeculativeSampling, FirstAndSecondTokensFollowTheLlmWithTopKTopPAndLowTemperature) {
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.top_p = 0.9f;
  ExpectSampledTokensFollowTheLlm(s, 20000);
}

// A draft with a vocabulary of its own (spec/draft_vocab.h), as scripts/boost_tune.py makes:
// the perturbed draft's rows for two tokens in three (and an "other tokens" row), so some of the
// LLM's likely tokens can never be proposed and the verifier's residual covers them.
std::string SubVocabularyDraft() {
  std::vector<int32_t> table;
  for (int32_t t = 0; t < 512; ++t)
    if (t % 3 != 2) table.push_back(t);
  table.push_back(-1);
  const auto path = testing::ScratchDir("sub_vocabulary_draft") / "draft.gguf";
  testing::WriteDraftVocabGguf(PerturbedStories260K(0.3f), table, path);
  return "model:" + path.string();
}

TEST(SpeculativeGreedy, EqualsIncrementalWithADraftOfItsOwnVocabulary) {
  const std::string draft = SubVocabularyDraft();
  auto engine = Stories({draft});
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  for (const std::string& shape : kShapes) cases.push_back({"sub-vocabulary draft", {draft}, shape});
  cases.push_back({"merged", {draft, "ngram"}, "2,2,1"});
  ExpectGreedyEqualsIncremental(*engine, {"Once upon a time", "The sun"}, cases, 80);
}

TEST(SpeculativeSampling, TokensFollowTheLlmWithADraftOfItsOwnVocabulary) {
  SamplingParams s;
  s.temperature = 1.0f;
  ExpectSampledTokensFollowTheLlm(s, 20000, SpecBudgetMode::kStatic, SubVocabularyDraft());
}

// The shipped boost-tuned SSM of the default model (models/ssm, scripts/boost_tune.py: its own
// 8192-token vocabulary, trained on the LLM's answers) as the draft of a chat answer, at
// temperature 0.8 with top-k 50. Tree 3: the second token, the one speculation decides (the
// first comes from the prompt's pass), is chosen among three sampled children; deeper levels
// would only decide tokens the test does not count (3,1,1 cost 2.5x the LLM tokens a pass).
// 16 answers side by side on an engine core.
TEST(SpeculativeSampling, TokensFollowTheLlmWithTheShippedTrainedDraft) {
  const std::string model = testing::DefaultModel();
  if (model.empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh places it)";
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_k = 50;
  SampledSetup setup;
  setup.llm = model;
  setup.prompt = "Give me three tips for staying focused while studying.";
  setup.chat = true;
  setup.tree = "3";
  setup.with_ngram = false;
  setup.batch = 16;
  ExpectSampledTokensFollowTheLlm(
      s, 4000, SpecBudgetMode::kStatic,
      "model:" + testing::SourcePath("models/ssm/smollm2-135m-instruct-boost0.gguf"), setup);
}

// --- Adaptive speculation (engine/spec_controller.h): the depth of each step's tree is chosen
// from the cost model and past acceptance; greedy output stays identical to incremental
// decoding and sampled output keeps the LLM's distribution. ---

TEST(AdaptiveSpeculation, GreedyEqualsIncrementalOnStories260K) {
  const std::string draft = "model:" + PerturbedStories260K(0.3f);
  auto engine = Stories({draft}, SpecBudgetMode::kAuto);
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  for (const char* shape : {"1,1,1,1,1,1", "4,1,1", "1,1,3,1,1,1,1,1"}) {
    cases.push_back({"ngram", {"ngram"}, shape});
    cases.push_back({"layers:2", {"layers:2"}, shape});
    cases.push_back({"merged", {"ngram", draft, "layers:3"}, shape});
  }
  ExpectGreedyEqualsIncremental(
      *engine, {"Once upon a time", "Lily and Ben went to the park. Lily and Ben"}, cases, 120);
}

TEST(AdaptiveSpeculation, FirstAndSecondTokensFollowTheLlmAtTemperatureOne) {
  SamplingParams s;
  s.temperature = 1.0f;
  ExpectSampledTokensFollowTheLlm(s, 20000, SpecBudgetMode::kAuto);
}

// --- Dynamic trees (SpecBudgetMode::kDynamic, spec/dynamic_tree.h): trees grown by draft
// confidence to the node budget the controller chooses; greedy output stays identical to
// incremental decoding and sampled output keeps the LLM's distribution. ---

TEST(DynamicTrees, GreedyEqualsIncrementalOnStories260K) {
  const std::string draft = "model:" + PerturbedStories260K(0.3f);
  auto engine = Stories({draft, "model:" + testing::Stories260KModel()}, SpecBudgetMode::kDynamic);
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  for (const std::string shape : {"1,1,1,1,1,1", "2,2,2", "1,1,3,1,1,1,1,1"}) {
    cases.push_back({"ngram", {"ngram"}, shape});
    cases.push_back({"ngram:1", {"ngram:1"}, shape});
    cases.push_back({"layers:2", {"layers:2"}, shape});
    cases.push_back({"perturbed draft model", {draft}, shape});
    cases.push_back({"itself as draft", {"model:" + testing::Stories260KModel()}, shape});
    cases.push_back({"merged", {"ngram", draft, "layers:3"}, shape});
  }
  ExpectGreedyEqualsIncremental(
      *engine, {"Once upon a time", "Lily and Ben went to the park. Lily and Ben"}, cases, 120);
}

TEST(DynamicTrees, DynamicTreesAreDraftedAndVerified) {
  // Text that repeats itself, prompt lookup. On stories260K a tree pass costs several plain ones,
  // so the controller mostly decodes plainly, but its probes draft dynamic trees (2 nodes, then
  // more where they are accepted); greedy output is still the plain one. A probe drafts nothing
  // where the lookup finds no match (about 60% of the steps here), so the run is long enough for
  // ~18 probes (one every SpecController::kProbePeriod steps; no-match probes do not thin them).
  auto engine = Stories({"ngram"}, SpecBudgetMode::kDynamic);
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt(
      "Lily and Ben went to the park. Lily and Ben went to the park. Lily and Ben went to the "
      "park. Lily and Ben went to the park. Lily and Ben");
  req.max_new_tokens = 300;
  req.sampling.temperature = 0;
  auto plain = engine->Generate(req);
  ASSERT_TRUE(plain.ok());
  req.speculators = engine->speculators();
  req.tree_shape = TreeShape::Chain(6);
  auto r = engine->Generate(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens, plain->tokens);
  std::printf("  dynamic, ngram: %lld tree nodes, %lld accepted, %.2f tokens per pass\n",
              static_cast<long long>(r->stats.spec.tree_nodes),
              static_cast<long long>(r->stats.spec.accepted_tokens), r->stats.tokens_per_pass());
  EXPECT_GT(r->stats.spec.tree_nodes, 0) << "no dynamic tree was drafted: nothing tested";
}

TEST(DynamicTrees, GreedyEqualsIncrementalOnSmolLM2) {
  const std::string model = testing::DefaultModel();
  if (model.empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh places it)";
  auto engine = MakeEngine(model, "", {}, SpecBudgetMode::kDynamic);
  ASSERT_TRUE(engine);
  std::vector<Case> cases;
  cases.push_back({"ngram", {"ngram"}, "1,1,1,1,1,1"});
  cases.push_back({"layers:20", {"layers:20"}, "1,1,1,1,1,1"});
  cases.push_back({"merged", {"ngram", "layers:24"}, "1,1,1,1"});
  ExpectGreedyEqualsIncremental(
      *engine,
      {"Rewrite in plain words: The committee has decided that the meeting will be postponed "
       "until further notice. Rewritten:"},
      cases, 40);
}

TEST(DynamicTrees, FirstAndSecondTokensFollowTheLlmAtTemperatureOne) {
  SamplingParams s;
  s.temperature = 1.0f;
  ExpectSampledTokensFollowTheLlm(s, 20000, SpecBudgetMode::kDynamic);
}

TEST(DynamicTrees, FirstAndSecondTokensFollowTheLlmWithTopKTopPAndLowTemperature) {
  SamplingParams s;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.top_p = 0.9f;
  ExpectSampledTokensFollowTheLlm(s, 20000, SpecBudgetMode::kDynamic);
}

// --- Bad settings ---

TEST(SpeculationSettings, BadDraftsAreRefusedWithAClearMessage) {
  auto engine = Stories();
  ASSERT_TRUE(engine);
  for (const char* bad : {"layers:5", "layers:0", "layers:", "layers:x", "ngram:0", "ngram:99",
                          "model:", "turbo", "ngram:3x"}) {
    auto s = engine->GetSpeculator(bad);
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  // Model drafts are loaded at start only.
  EXPECT_EQ(engine->GetSpeculator("model:" + testing::Stories260KModel()).status().code(),
            StatusCode::kFailedPrecondition);

  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.drafts = {"model:/nonexistent/draft.gguf"};
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kNotFound);
  o.drafts = {"layers:99"};
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("5 layers"), std::string::npos) << e.status().ToString();
}

// A llama2.c checkpoint of a tiny random model with a 256-token vocabulary.
std::string OtherVocabularyModel() {
  const int32_t dim = 16, hidden = 32, layers = 1, heads = 2, vocab = 256, seq = 64;
  const int32_t header[7] = {dim, hidden, layers, heads, heads, vocab, seq};
  const int64_t floats = int64_t{vocab} * dim + layers * dim * 2 + layers * dim * dim * 4 +
                         layers * hidden * dim * 3 + dim + seq * (dim / heads);
  std::string data(reinterpret_cast<const char*>(header), sizeof(header));
  std::vector<float> w(floats, 0.01f);
  data.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  const auto path = testing::ScratchDir("othervocab") / "other.bin";
  testing::WriteFile(path, data);
  return path.string();
}

TEST(SpeculationSettings, ADraftWithAnotherVocabularyIsRefused) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.drafts = {"model:" + OtherVocabularyModel()};
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("vocabulary"), std::string::npos) << e.status().ToString();
}

TEST(SpeculationSettings, BadTreeShapesAreRefusedByGenerate) {
  auto engine = Stories();
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Hi");
  req.speculators = {*engine->GetSpeculator("ngram")};
  for (std::vector<int32_t> widths : std::vector<std::vector<int32_t>>{{}, {0}, {1, 0}, {64},
                                                                        {16, 16, 16}}) {
    req.tree_shape.widths = widths;
    EXPECT_EQ(engine->Generate(req).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specinfer
