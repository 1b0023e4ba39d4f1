// Automatic prefix caching in the engine core (kv/kv_cache.h, engine/core_scheduler.h) on
// stories260K: with it on, every sequence's tokens and logits must be bit-identical to running
// with it off: multi-turn conversations sharing a system prompt, concurrent sequences sharing a
// prefix, speculation on, eviction under memory pressure; and a write into a shared block must
// go to a private copy (copy-on-write) whose entries equal the original's.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/executor.h"
#include "test_util.h"

namespace specinfer {
namespace {

std::unique_ptr<Engine> MakeEngine(int32_t max_sequences) {
  EngineOptions o;
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
  std::vector<float> logits;  // of every streamed token, concatenated
};

// Runs `reqs` at once on a fresh engine core over `kv`; returns each one's outcome.
std::vector<Outcome> RunAll(Engine& engine, KvCacheManager& kv, BatchOptions o,
                            const std::vector<GenerateRequest>& reqs) {
  EngineCore core(engine.runner(), kv, o);
  std::vector<Outcome> out(reqs.size());
  size_t next = 0;
  for (int steps = 0; steps < 20000; ++steps) {
    while (next < reqs.size()) {
      Outcome& slot = out[next];
      auto a = core.Add(
          reqs[next],
          [&slot](int32_t t, std::span<const float> l) {
            slot.streamed.push_back(t);
            slot.logits.insert(slot.logits.end(), l.begin(), l.end());
            return true;
          },
          [&slot](StatusOr<GenerateResult> r) { slot.done = std::move(r); });
      EXPECT_TRUE(a.ok()) << a.status().ToString();
      if (!a.ok() || *a == EngineCore::Admission::kNoRoom) break;
      ++next;
    }
    if (next == reqs.size() && core.idle()) break;
    core.Step();
  }
  return out;
}

void ExpectSame(const std::vector<Outcome>& on, const std::vector<Outcome>& off,
                const std::string& what) {
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    ASSERT_TRUE(on[i].done && off[i].done) << what << " " << i;
    ASSERT_TRUE(on[i].done->ok()) << what << " " << i << on[i].done->status().ToString();
    ASSERT_TRUE(off[i].done->ok()) << what << " " << i << off[i].done->status().ToString();
    EXPECT_EQ((*on[i].done)->tokens, (*off[i].done)->tokens) << what << " " << i;
    ASSERT_EQ(on[i].logits.size(), off[i].logits.size()) << what << " " << i;
    EXPECT_EQ(std::memcmp(on[i].logits.data(), off[i].logits.data(),
                          on[i].logits.size() * sizeof(float)),
              0)
        << what << " " << i << ": logits differ";
  }
}

const char* kSystem =
    "Lily and Ben went to the park. They saw a big dog. The dog was happy and ran to them. "
    "They played with a ball all day, and when the sun went down they went home to eat.";
const char* kQuestions[] = {" Once upon a time", " One day", " The cat sat on the mat",
                            " Tom had a red car"};

// Four conversations of three turns sharing a system prompt, run turn by turn (each turn's
// prompt is the last one plus its answer plus the next question), greedy and speculative.
TEST(PrefixCacheEngine, MultiTurnConversationsEqualWithTheCacheOff) {
  // Two engines: the cache's entries live in the runner's KV storage, which one run with the
  // cache off would overwrite.
  auto engine = MakeEngine(8), engine_off = MakeEngine(8);
  ASSERT_TRUE(engine && engine_off);
  const std::vector<int32_t> system = *engine->EncodePrompt(kSystem);
  for (bool speculate : {false, true}) {
    std::vector<std::vector<int32_t>> conv(4, system);
    std::vector<std::vector<int32_t>> conv_off = conv;
    int64_t cached_total = 0;
    for (int turn = 0; turn < 3; ++turn) {
      std::vector<GenerateRequest> reqs_on, reqs_off;
      for (int c = 0; c < 4; ++c) {
        const auto q = *engine->EncodePrompt(kQuestions[(c + turn) % 4]);
        for (auto* v : {&conv[c], &conv_off[c]}) v->insert(v->end(), q.begin() + 1, q.end());
        GenerateRequest r;
        r.max_new_tokens = 12;
        const char* draft = c % 2 ? "ngram" : "layers:2";
        if (speculate) r.tree_shape = *TreeShape::Parse("2,1,1");
        r.prompt_tokens = conv[c];
        if (speculate) r.speculators = {*engine->GetSpeculator(draft)};
        reqs_on.push_back(r);
        r.prompt_tokens = conv_off[c];
        if (speculate) r.speculators = {*engine_off->GetSpeculator(draft)};
        reqs_off.push_back(r);
      }
      BatchOptions on, off;
      on.spec_budget = off.spec_budget = SpecBudgetMode::kStatic;  // see the next test
      off.prefix_cache = false;
      const auto out_off = RunAll(*engine_off, engine_off->kv(), off, reqs_off);
      const auto out_on = RunAll(*engine, engine->kv(), on, reqs_on);
      ExpectSame(out_on, out_off, "turn " + std::to_string(turn));
      for (int c = 0; c < 4; ++c) {
        if (!out_on[c].done || !out_on[c].done->ok()) continue;
        const auto& res = **out_on[c].done;
        cached_total += res.stats.cached_prompt_tokens;
        // Every later turn finds the whole previous turn's full blocks at least.
        if (turn > 0) {
          EXPECT_GE(res.stats.cached_prompt_tokens, 16) << c << " turn " << turn;
        }
        for (auto* v : {&conv[c], &conv_off[c]})
          v->insert(v->end(), res.tokens.begin(), res.tokens.end());
      }
    }
    EXPECT_GT(cached_total, 0);
    EXPECT_GT(engine->kv().prefix_stats().hit_tokens, 0);
  }
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

// Sixteen sequences admitted together, half of them with the same long prompt and half
// diverging from it inside a block: shared blocks, deduplicated copies, equal outputs.
TEST(PrefixCacheEngine, ConcurrentSequencesSharingAPrefixEqualWithTheCacheOff) {
  auto engine = MakeEngine(16);
  ASSERT_TRUE(engine);
  const std::vector<int32_t> base = *engine->EncodePrompt(kSystem);
  ASSERT_GT(base.size(), 40u);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    GenerateRequest r;
    r.prompt_tokens = base;
    if (i % 2) r.prompt_tokens[20 + i] = 1 + i;  // diverges inside the second block
    r.max_new_tokens = 10 + i;
    if (i % 4 == 3) {
      r.speculators = {*engine->GetSpeculator("ngram")};
      r.tree_shape = *TreeShape::Parse("1,1,1");
    }
    reqs.push_back(r);
  }
  // Static trees: these requests sample (seeded), and a seeded speculative sample depends on the
  // trees, which the adaptive controller would choose from each run's timings.
  BatchOptions on, off;
  on.spec_budget = off.spec_budget = SpecBudgetMode::kStatic;
  on.max_sequences = off.max_sequences = 16;
  on.max_batch_tokens = off.max_batch_tokens = 64;  // prefill spread over several passes
  off.prefix_cache = false;
  // The cache off first: it leaves nothing cached for the run with it on.
  const auto out_off = RunAll(*engine, engine->kv(), off, reqs);
  const auto out_on = RunAll(*engine, engine->kv(), on, reqs);
  ExpectSame(out_on, out_off, "sequence");
  // A second round finds every prompt's first block (and the common prompt's later ones).
  const auto again = RunAll(*engine, engine->kv(), on, reqs);
  ExpectSame(again, out_off, "second round, sequence");
  for (size_t i = 0; i < again.size(); ++i)
    EXPECT_GE((*again[i].done)->stats.cached_prompt_tokens, 16) << i;
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

// A KV cache far smaller than the prompts' total: cached blocks are evicted (LRU) as new ones
// are needed, and the outputs stay those of the cache off.
TEST(PrefixCacheEngine, EvictionUnderMemoryPressureKeepsOutputsExact) {
  auto engine = MakeEngine(1);
  ASSERT_TRUE(engine);
  KvCacheManager kv(24, engine->kv().block_size());
  std::vector<GenerateRequest> reqs;
  const std::vector<int32_t> base = *engine->EncodePrompt(kSystem);
  for (int i = 0; i < 12; ++i) {
    GenerateRequest r;
    r.prompt_tokens = base;
    r.prompt_tokens[1 + (i % 6) * 8] = 1 + i;  // six prefixes, each seen twice
    r.max_new_tokens = 16;
    reqs.push_back(r);
  }
  BatchOptions on, off;
  on.spec_budget = off.spec_budget = SpecBudgetMode::kStatic;  // see the test above
  on.max_sequences = off.max_sequences = 3;
  off.prefix_cache = false;
  const auto out_off = RunAll(*engine, kv, off, reqs);
  const auto out_on = RunAll(*engine, kv, on, reqs);
  ExpectSame(out_on, out_off, "sequence");
  EXPECT_GT(kv.prefix_stats().evictions, 0);
  EXPECT_EQ(kv.used_blocks(), 0);
}

// The cache is on by default and follows BatchOptions; with BLAS prefill (Generator) it stays
// off, since BLAS rounding of prompt entries depends on the chunk they were computed in.
TEST(PrefixCacheEngine, OnByDefaultOffOnRequestAndWithBlasPrefill) {
  auto engine = MakeEngine(1);
  ASSERT_TRUE(engine);
  {
    EngineCore core(engine->runner(), engine->kv(), BatchOptions{});
    EXPECT_TRUE(engine->kv().prefix_caching());
  }
  BatchOptions off;
  off.prefix_cache = false;
  {
    EngineCore core(engine->runner(), engine->kv(), off);
    EXPECT_FALSE(engine->kv().prefix_caching());
  }
  BatchOptions blas;
  blas.blas_prefill = true;
  {
    EngineCore core(engine->runner(), engine->kv(), blas);
    EXPECT_FALSE(engine->kv().prefix_caching());
  }
}

// Copy-on-write: a sequence that backs up into a block it shares and writes there gets a private
// copy; its logits equal a fresh computation, and the sharer's entries are unchanged.
TEST(PrefixCacheEngine, WritingIntoASharedBlockGoesToAPrivateCopy) {
  auto engine = MakeEngine(2), reference = MakeEngine(1);  // the reference has its own KV storage
  ASSERT_TRUE(engine && reference);
  ModelRunner& runner = engine->runner();
  KvCacheManager kv(16, engine->kv().block_size());
  kv.set_prefix_caching(true);
  const int32_t bs = kv.block_size();
  std::vector<int32_t> prompt = *engine->EncodePrompt(kSystem);
  prompt.resize(static_cast<size_t>(2 * bs + 3));
  const int32_t vocab = engine->model().config().vocab_size;
  Executor exec(runner, kv);

  // Sequence a computes the prompt; its two full blocks are registered.
  SeqId a = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(a, static_cast<int32_t>(prompt.size())).ok());
  {
    ForwardBatch batch;
    std::vector<int32_t> pos(prompt.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    batch.AddSequence(a, prompt, pos, 0, nullptr);
    PassOutput pass = exec.Run(batch, {});
    ASSERT_TRUE(pass.status.ok()) << pass.status.ToString();
  }
  kv.CommitTokens(a, prompt);
  // b attaches both blocks, backs up to the middle of the second and writes other tokens there.
  SeqId b = kv.AddSequence();
  ASSERT_EQ(kv.AttachCachedPrefix(b, prompt, 2 * bs), 2 * bs);
  const int32_t keep = bs + 5;
  kv.Truncate(b, keep);
  std::vector<int32_t> tail = {3, 7, 11};
  ASSERT_TRUE(kv.Reserve(b, keep + 3).ok());
  EXPECT_TRUE(kv.has_pending_copies());
  EXPECT_NE(kv.BlockTable(b)[1], kv.BlockTable(a)[1]);
  ForwardBatch batch;
  batch.AddSequence(b, tail, std::vector<int32_t>{keep, keep + 1, keep + 2}, keep, nullptr);
  batch.logit_rows = {0, 1, 2};
  const LogitsRows rows{0, 3};
  PassOutput pass = exec.Run(batch, std::span(&rows, 1));
  ASSERT_TRUE(pass.status.ok()) << pass.status.ToString();
  std::vector<float> got(pass.rows[0].logits.begin(), pass.rows[0].logits.end());

  // The same tokens computed from scratch, without sharing.
  std::vector<int32_t> fresh(prompt.begin(), prompt.begin() + keep);
  fresh.insert(fresh.end(), tail.begin(), tail.end());
  const auto want = testing::PromptLogits(reference->runner(), reference->kv(), fresh,
                                          {keep, keep + 1, keep + 2});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  ASSERT_EQ(want.size(), 3u * vocab);

  // a's entries are unchanged: its next token's logits equal a fresh run of prompt + 1 token.
  ASSERT_TRUE(kv.Reserve(a, static_cast<int32_t>(prompt.size()) + 1).ok());
  ForwardBatch next;
  const int32_t n = static_cast<int32_t>(prompt.size());
  next.AddSequence(a, std::vector<int32_t>{5}, std::vector<int32_t>{n}, n, nullptr);
  next.logit_rows = {0};
  const LogitsRows one{0, 1};
  PassOutput pa = exec.Run(next, std::span(&one, 1));
  ASSERT_TRUE(pa.status.ok()) << pa.status.ToString();
  std::vector<int32_t> a_fresh = prompt;
  a_fresh.push_back(5);
  const auto a_want = testing::PromptLogits(reference->runner(), reference->kv(), a_fresh, {n});
  EXPECT_EQ(std::memcmp(pa.rows[0].logits.data(), a_want.data(), a_want.size() * sizeof(float)), 0);

  // A pass that would write into the shared first block is refused.
  ForwardBatch bad;
  bad.AddSequence(b, std::vector<int32_t>{9}, std::vector<int32_t>{3}, 3, nullptr);
  EXPECT_EQ(exec.Run(bad, {}).status.code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace specinfer
