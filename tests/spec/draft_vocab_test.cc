// Drafts with a vocabulary of their own (spec/draft_vocab.h): the table maps tokens in and
// logits out, so a draft whose rows are the LLM's in another order proposes exactly the trees
// (and, under sampling, the distributions) of the draft in the LLM's order; a draft of a subset
// proposes only tokens of its table; speculative greedy output still equals plain decoding and
// sampled output keeps the LLM's distribution (speculative_generation_test.cc); bad tables and
// such a draft loaded as the LLM are clear errors.
#include "spec/draft_vocab.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "model/loader.h"
#include "spec/speculator.h"
#include "test_util.h"
#include "tokenizer/llama2c_tokenizer.h"

namespace specinfer {
namespace {

TEST(DraftVocab, MapsTokensInAndLogitsOut) {
  // Rows: token 5, "other", token 2, token 7; LLM vocabulary of 8.
  auto v = DraftVocab::Create(std::vector<int32_t>{5, -1, 2, 7}, 8);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->size(), 4);
  EXPECT_EQ(v->llm_vocab(), 8);
  EXPECT_EQ(v->ToDraft(5), 0);
  EXPECT_EQ(v->ToDraft(2), 2);
  EXPECT_EQ(v->ToDraft(7), 3);
  for (int32_t t : {0, 1, 3, 4, 6}) EXPECT_EQ(v->ToDraft(t), 1) << t;  // the "other" row
  const std::vector<float> draft = {0.5f, 9.0f, -1.0f, 2.0f,   // row 0
                                    1.0f, 0.0f, 3.0f, -2.0f};  // row 1
  std::vector<float> wide(16, 123.0f);
  v->WidenLogits(draft, 2, wide);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> want = {ninf, ninf, -1.0f, ninf, ninf, 0.5f, ninf, 2.0f,
                                   ninf, ninf, 3.0f,  ninf, ninf, 1.0f, ninf, -2.0f};
  EXPECT_EQ(wide, want);  // the "other" row's logit is never a token's
}

TEST(DraftVocab, BadTablesAreRefused) {
  EXPECT_FALSE(DraftVocab::Create(std::vector<int32_t>{}, 8).ok());
  EXPECT_FALSE(DraftVocab::Create(std::vector<int32_t>{1, 8}, 8).ok());     // beyond the LLM's
  EXPECT_FALSE(DraftVocab::Create(std::vector<int32_t>{1, -2}, 8).ok());    // not a token
  EXPECT_FALSE(DraftVocab::Create(std::vector<int32_t>{3, 1, 3}, 8).ok());  // twice
  auto two_others = DraftVocab::Create(std::vector<int32_t>{-1, 4, -1}, 8);
  ASSERT_FALSE(two_others.ok());
  EXPECT_NE(two_others.status().message().find("rows 0 and 2"), std::string::npos)
      << two_others.status().ToString();
  // Without an "other" row, tokens outside the table read as row 0.
  auto v = DraftVocab::Create(std::vector<int32_t>{6, 1}, 8);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ToDraft(3), 0);
  EXPECT_EQ(v->ToDraft(1), 1);
}

std::unique_ptr<Speculator> Draft(const std::string& spec) {
  auto llm = LoadModel(testing::Stories260KModel());
  EXPECT_TRUE(llm.ok()) << llm.status().ToString();
  if (!llm.ok()) return nullptr;
  SpeculatorOptions so;
  so.num_threads = 1;
  auto s = CreateSpeculator(spec, std::shared_ptr<const Model>(std::move(*llm)), so);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Trees of `spec` for a few contexts, greedy and sampled (seeded).
std::vector<TokenTree> Trees(const std::string& spec, const SamplingParams& sampling,
                             const std::vector<std::vector<int32_t>>& contexts) {
  std::vector<TokenTree> out;
  auto draft = Draft(spec);
  if (!draft) return out;
  auto session = draft->StartSession();
  EXPECT_TRUE(session.ok());
  if (!session.ok()) return out;
  const TreeShape shape = *TreeShape::Parse("3,2,1");
  Rng rng(99);
  for (const auto& tokens : contexts) {
    DraftContext ctx;
    ctx.tokens = tokens;
    ctx.shape = &shape;
    ctx.max_depth = 3;
    ctx.sampling = &sampling;
    ctx.rng = &rng;
    auto tree = (*session)->Propose(ctx);
    EXPECT_TRUE(tree.ok()) << tree.status().ToString();
    if (tree.ok()) out.push_back(std::move(*tree));
  }
  return out;
}

std::vector<std::vector<int32_t>> Contexts(int32_t below) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> out;
  for (int32_t n : {1, 7, 30, 8}) {
    std::vector<int32_t> t = {1};
    for (int32_t i = 1; i < n; ++i) t.push_back(3 + static_cast<int32_t>(rng() % (below - 3)));
    out.push_back(t);
  }
  out.push_back(out[2]);  // the same context again: the draft's cache keeps its prefix
  out.back().push_back(11);
  return out;
}

TEST(DraftVocabSpeculator, PermutedRowsProposeTheSameTreesAndDistributions) {
  std::vector<int32_t> table(512);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  const auto path = testing::ScratchDir("draft_vocab_permuted") / "draft.gguf";
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), table, path);
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams sampled;
  sampled.temperature = 0.9f;
  sampled.top_p = 0.95f;
  for (const SamplingParams& s : {greedy, sampled}) {
    const auto contexts = Contexts(512);
    const auto want = Trees("model:" + testing::Stories260KModel(), s, contexts);
    const auto got = Trees("model:" + path.string(), s, contexts);
    ASSERT_EQ(want.size(), contexts.size());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size()) << "context " << i;
      ASSERT_GT(got[i].size(), 1);
      for (int32_t v = 0; v < want[i].size(); ++v) {
        EXPECT_EQ(got[i].node(v).token, want[i].node(v).token) << "context " << i << " node " << v;
        EXPECT_EQ(got[i].node(v).parent, want[i].node(v).parent);
        const auto& a = want[i].node(v).trials;
        const auto& b = got[i].node(v).trials;
        ASSERT_EQ(a.size(), b.size());
        for (size_t t = 0; t < a.size(); ++t) {
          if (a[t].dist < 0) continue;
          const auto p = want[i].distribution(a[t].dist);
          const auto q = got[i].distribution(b[t].dist);
          ASSERT_EQ(p.size(), q.size());
          EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0)
              << "context " << i << ": the draft distribution at node " << v << " differs";
        }
      }
    }
  }
}

TEST(DraftVocabSpeculator, ASubsetProposesOnlyItsTokens) {
  // Tokens 0..299 and an "other" row; contexts of table tokens only, so the draft computes the
  // full draft's logits there and its guesses are the full draft's best tokens of the table.
  std::vector<int32_t> table(300);
  std::iota(table.begin(), table.end(), 0);
  table.push_back(-1);
  const auto path = testing::ScratchDir("draft_vocab_subset") / "draft.gguf";
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), table, path);
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto contexts = Contexts(300);
  for (const SamplingParams& s : {greedy, sampled}) {
    for (const TokenTree& tree : Trees("model:" + path.string(), s, contexts)) {
      ASSERT_GT(tree.size(), 1);
      for (int32_t v = 1; v < tree.size(); ++v) EXPECT_LT(tree.node(v).token, 300);
      for (int32_t v = 0; v < tree.size(); ++v)
        for (const auto& trial : tree.node(v).trials) {
          if (trial.dist < 0) continue;
          const auto q = tree.distribution(trial.dist);
          ASSERT_EQ(q.size(), 512u);
          for (size_t t = 300; t < q.size(); ++t) ASSERT_EQ(q[t], 0.0f) << "token " << t;
        }
    }
  }
  // Greedy: the first guess is the full draft's best token below 300.
  auto llm = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(llm.ok());
  std::shared_ptr<const Model> model(std::move(*llm));
  const auto trees = Trees("model:" + path.string(), greedy, contexts);
  for (size_t i = 0; i < contexts.size(); ++i) {
    const std::vector<float> logits = testing::LastLogits(model, contexts[i]);
    const auto best = std::max_element(logits.begin(), logits.begin() + 300) - logits.begin();
    EXPECT_EQ(trees[i].node(trees[i].node(0).children[0]).token, best) << "context " << i;
  }
}

TEST(DraftVocabSpeculator, AFingerprintStandsInForTheTokenizer) {
  // boost_tune.py's drafts carry the LLM's vocabulary fingerprint, not its 1.7 MiB tokenizer:
  // loaded for the LLM whose tokenizer has that fingerprint, refused for another one.
  auto llm = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(llm.ok());
  std::shared_ptr<const Model> model(std::move(*llm));
  auto tokenizer = Llama2cTokenizer::Load(testing::Stories260KTokenizer(), 512);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  SpeculatorOptions so;
  so.llm_tokenizer = tokenizer->get();
  const uint64_t fp = VocabFingerprint(**tokenizer);
  const auto dir = testing::ScratchDir("draft_vocab_fingerprint");
  const std::vector<int32_t> table = {1, 2, 4, 9, 300, -1};
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), table, dir / "same.gguf", fp);
  auto same = CreateSpeculator("model:" + (dir / "same.gguf").string(), model, so);
  EXPECT_TRUE(same.ok()) << same.status().ToString();
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), table, dir / "other.gguf", fp ^ 1);
  auto other = CreateSpeculator("model:" + (dir / "other.gguf").string(), model, so);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("was made for a vocabulary with fingerprint"),
            std::string::npos)
      << other.status().ToString();
  // The fingerprint covers the pieces, not only the size: one piece changed, another value.
  std::vector<std::string> pieces;
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id)
    pieces.emplace_back((*tokenizer)->TokenPiece(id));
  const std::vector<float> scores(pieces.size(), 0.0f);
  auto original = Llama2cTokenizer::FromVocab(pieces, scores, {});
  pieces[300] += "x";
  auto changed = Llama2cTokenizer::FromVocab(pieces, scores, {});
  ASSERT_TRUE(original.ok()) << original.status().ToString();
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_NE(VocabFingerprint(**original), VocabFingerprint(**changed));
}

TEST(DraftVocabSpeculator, BadTablesAndDraftsServedAsTheModelAreClearErrors) {
  SpeculatorOptions so;
  auto llm = LoadModel(testing::Stories260KModel());
  ASSERT_TRUE(llm.ok());
  std::shared_ptr<const Model> model(std::move(*llm));
  const auto dir = testing::ScratchDir("draft_vocab_bad");
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), {4, 9, 4}, dir / "twice.gguf");
  auto twice = CreateSpeculator("model:" + (dir / "twice.gguf").string(), model, so);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("token 4 is in rows 0 and 2"), std::string::npos)
      << twice.status().ToString();
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), {4, 600}, dir / "beyond.gguf");
  auto beyond = CreateSpeculator("model:" + (dir / "beyond.gguf").string(), model, so);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("outside the model's vocabulary"), std::string::npos)
      << beyond.status().ToString();
  // As the served model its rows would be read as token ids: refused, naming the way to use it.
  testing::WriteDraftVocabGguf(testing::Stories260KModel(), {4, 9, -1}, dir / "ok.gguf");
  ServingLoadOptions lo;
  lo.tokenizer_optional = true;  // this file has none; boost_tune.py's carry the LLM's
  auto served = LoadModelForServing((dir / "ok.gguf").string(), lo);
  ASSERT_FALSE(served.ok());
  EXPECT_NE(served.status().message().find("--draft model:PATH"), std::string::npos)
      << served.status().ToString();
}

}  // namespace
}  // namespace specinfer
