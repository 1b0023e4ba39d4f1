// Helpers of the LLM-worker tests (tests/dist on CPU workers, tests/dist_cuda on GPU ones): a
// TP x PP group of LlmWorkerServers in this process (each on 127.0.0.1 with a port of its own and
// one compute thread; Gloo over loopback), a scenario of forward passes that covers prefill,
// decode, several sequences per batch, token trees with masks, masked KV entries and MoveKv,
// whose logits are compared between runners, and generation through EngineCore on any runner.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_runner.h"
#include "dist/llm_client.h"
#include "dist/llm_worker.h"
#include "dist/model_identity.h"
#include "engine/engine_core.h"
#include "kv/kv_cache.h"
#include "model/loader.h"
#include "spec/token_tree.h"
#include "test_util.h"

namespace specinfer::testing {

// stories260K with its tokenizer, loaded once per test program (model null if it failed, with
// a test failure).
struct Stories {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  uint64_t fingerprint = 0;  // VocabFingerprint of the tokenizer, what workers are started with
  std::vector<int32_t> Encode(const std::string& text) const {
    return *tokenizer->Encode(text, /*add_bos=*/true);
  }
};

inline const Stories& LoadStories() {
  static const Stories* s = [] {
    auto loaded = LoadModelAndTokenizer(Stories260KModel(), Stories260KTokenizer());
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    auto* st = new Stories;
    if (loaded.ok()) {
      st->fingerprint = VocabFingerprint(*loaded->tokenizer);
      st->model = std::shared_ptr<const Model>(std::move(loaded->model));
      st->tokenizer = std::shared_ptr<const Tokenizer>(std::move(loaded->tokenizer));
    }
    return st;
  }();
  return *s;
}

// Runs every request to completion on `runner` through one EngineCore (static trees: the
// requests may sample, seeded, and the same draws need the same trees, which the adaptive
// controller would choose from each runner's timings); returns the tokens. Adds to
// *cached_prompt_tokens the prompt tokens the prefix cache served, if given.
inline std::vector<std::vector<int32_t>> GenerateAll(ModelRunner& runner, KvCacheManager& kv,
                                                     const std::vector<GenerateRequest>& reqs,
                                                     bool prefix_cache = true,
                                                     int32_t* cached_prompt_tokens = nullptr) {
  BatchOptions o;
  o.prefix_cache = prefix_cache;
  o.max_sequences = 4;
  o.max_batch_tokens = 24;  // prefill chunks share passes with trees
  o.spec_budget = SpecBudgetMode::kStatic;
  EngineCore gen(runner, kv, o);
  std::vector<std::optional<StatusOr<GenerateResult>>> done(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto a = gen.Add(reqs[i], nullptr, [&done, i](StatusOr<GenerateResult> r) { done[i] = r; });
    EXPECT_TRUE(a.ok() && *a == EngineCore::Admission::kAdmitted) << i;
  }
  for (int steps = 0; !gen.idle() && steps < 5000; ++steps) gen.Step();
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(done[i].has_value() && done[i]->ok())
        << i << ": " << (done[i] ? done[i]->status().ToString() : "not done");
    out.push_back(done[i] && done[i]->ok() ? (*done[i])->tokens : std::vector<int32_t>{});
    if (cached_prompt_tokens && done[i] && done[i]->ok())
      *cached_prompt_tokens += (*done[i])->stats.cached_prompt_tokens;
  }
  EXPECT_EQ(kv.used_blocks(), 0);
  return out;
}

// Three sampled requests on stories260K whose callbacks read no logits: two verify token trees
// ("2,1,1") drafted by `speculator` (top-k 20; top-p 0.8), the third decodes plainly, its tokens
// draws. Seeds seed, seed + 1, seed + 2.
inline std::vector<GenerateRequest> SampledRequests(
    const Stories& st, Speculator* speculator, int32_t max_new_tokens, uint64_t seed,
    int32_t prefill_chunk = GenerateRequest{}.prefill_chunk) {
  std::vector<GenerateRequest> reqs;
  const char* prompts[] = {"Once upon a time", "Lily and Ben went to the park. They saw",
                           "The cat"};
  for (int i = 0; i < 3; ++i) {
    GenerateRequest r;
    r.prompt_tokens = st.Encode(prompts[i]);
    r.max_new_tokens = max_new_tokens;
    r.prefill_chunk = prefill_chunk;
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = i == 1 ? 0 : 20;
    r.sampling.top_p = i == 1 ? 0.8f : 1.0f;
    r.sampling.seed = seed + static_cast<uint64_t>(i);
    if (i < 2) {
      r.speculators = {speculator};
      r.tree_shape = *TreeShape::Parse("2,1,1");
    }
    r.callback_logits = false;
    reqs.push_back(r);
  }
  return reqs;
}

// `reqs` (callbacks reading no logits) over the group behind `remote`: the group answers with
// distribution rows and draws, and the tokens equal `want` (another runner's), request for
// request; the same requests reading logits give the same tokens for several times the response
// bytes a pass (printed, tagged `what`).
inline void ExpectDistributionRowsGiveTokensForFewerBytes(
    RemoteLlmRunner& remote, KvCacheManager& remote_kv, const std::vector<GenerateRequest>& reqs,
    const std::vector<std::vector<int32_t>>& want, const std::string& what) {
  EXPECT_TRUE(remote.returns_distributions()) << what;
  EXPECT_TRUE(remote.draws_tokens()) << what;
  const auto before = remote.traffic();
  const auto got = GenerateAll(remote, remote_kv, reqs);
  const auto after = remote.traffic();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].size(), static_cast<size_t>(reqs[i].max_new_tokens))
        << what << ", request " << i;
    EXPECT_EQ(got[i], want[i]) << what << ", request " << i;
  }
  std::vector<GenerateRequest> with_logits = reqs;
  for (GenerateRequest& r : with_logits) r.callback_logits = true;
  EXPECT_EQ(GenerateAll(remote, remote_kv, with_logits), want) << what;
  const auto end = remote.traffic();
  const double dist_bytes = static_cast<double>(after.response_bytes - before.response_bytes) /
                            static_cast<double>(after.passes - before.passes);
  const double logits_bytes = static_cast<double>(end.response_bytes - after.response_bytes) /
                              static_cast<double>(end.passes - after.passes);
  std::printf(
      "[llm group %s, sampled] %.0f response bytes a pass with distribution rows, %.0f "
      "with logits rows\n",
      what.c_str(), dist_bytes, logits_bytes);
  EXPECT_LT(dist_bytes * 3, logits_bytes) << what;
}

struct LlmTestGroup {
  std::shared_ptr<const Model> model;
  uint64_t fingerprint = 0;
  int32_t tp = 1, pp = 1;
  std::vector<std::unique_ptr<LlmWorkerServer>> workers;  // stage-major
  std::vector<std::string> addresses;

  LlmWorkerOptions OptionsFor(size_t i, const std::string& listen = "127.0.0.1:0") const {
    LlmWorkerOptions o;
    o.listen = listen;
    o.stage = static_cast<int32_t>(i) / tp;
    o.num_stages = pp;
    o.tp_rank = static_cast<int32_t>(i) % tp;
    o.tp_size = tp;
    o.num_threads = 1;
    o.max_sequences = 4;
    return o;
  }

  // Starts worker i (again) on its old port, or a fresh one.
  Status StartWorker(size_t i) {
    const std::string listen = addresses.size() > i ? addresses[i] : std::string("127.0.0.1:0");
    auto w = LlmWorkerServer::Start(OptionsFor(i, listen), model, fingerprint);
    if (!w.ok()) return w.status();
    if (addresses.size() <= i) addresses.resize(i + 1);
    addresses[i] = (*w)->address();
    if (workers.size() <= i) workers.resize(i + 1);
    workers[i] = std::move(*w);
    return Status::Ok();
  }

  LlmGroupOptions GroupOptions() const {
    LlmGroupOptions o;
    o.workers = addresses;
    o.tp_size = tp;
    o.num_stages = pp;
    o.rpc_timeout = std::chrono::milliseconds(20000);
    o.collective_timeout = std::chrono::milliseconds(3000);
    o.probe_timeout = std::chrono::milliseconds(1000);
    return o;
  }
};

inline std::unique_ptr<LlmTestGroup> StartLlmGroup(std::shared_ptr<const Model> model,
                                                   uint64_t fingerprint, int32_t tp, int32_t pp) {
  auto g = std::make_unique<LlmTestGroup>();
  g->model = std::move(model);
  g->fingerprint = fingerprint;
  g->tp = tp;
  g->pp = pp;
  for (size_t i = 0; i < static_cast<size_t>(tp * pp); ++i) {
    Status s = g->StartWorker(i);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return nullptr;
  }
  return g;
}

// A single-threaded CPU runner sized like the workers' KV (and its cache manager).
struct LocalRunner {
  std::unique_ptr<CpuModelRunner> runner;
  std::unique_ptr<KvCacheManager> kv;
};
inline LocalRunner MakeLocalRunner(std::shared_ptr<const Model> model, int32_t blocks,
                                   int32_t block_size = 16) {
  CpuRunnerOptions o;
  o.num_threads = 1;
  o.num_kv_blocks = blocks;
  o.kv_block_size = block_size;
  auto r = CpuModelRunner::Create(std::move(model), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  LocalRunner l;
  if (r.ok()) l.runner = std::move(*r);
  l.kv = std::make_unique<KvCacheManager>(blocks, block_size);
  return l;
}

// One forward pass: returns its logits rows ([logit_rows, vocab]); ADD_FAILURE on error.
inline std::vector<float> Pass(ModelRunner& r, KvCacheManager& kv, const ForwardBatch& b) {
  std::vector<float> logits(b.logit_rows.size() * r.model().config().vocab_size, -1.0f);
  Status s = r.Forward(b, kv, logits);
  EXPECT_TRUE(s.ok()) << r.name() << ": " << s.ToString();
  return logits;
}

inline std::vector<int32_t> AllRows(const ForwardBatch& b) {
  std::vector<int32_t> rows(b.size());
  for (int32_t i = 0; i < b.size(); ++i) rows[i] = i;
  return rows;
}

// The scenario: the logits of every pass, in order. Token ids are taken modulo the vocabulary.
inline std::vector<std::vector<float>> RunScenario(ModelRunner& r, KvCacheManager& kv) {
  const int32_t V = r.model().config().vocab_size;
  auto tok = [&](int32_t i) { return (i * 37 + 11) % V; };
  std::vector<std::vector<float>> out;
  // 1. Prompt prefill of 20 tokens (more than a block), every row's logits.
  const SeqId a = kv.AddSequence();
  EXPECT_TRUE(kv.Reserve(a, 20).ok());
  {
    ForwardBatch b;
    std::vector<int32_t> t, p;
    for (int32_t i = 0; i < 20; ++i) t.push_back(tok(i)), p.push_back(i);
    b.AddSequence(a, t, p, 0, nullptr);
    b.logit_rows = AllRows(b);
    out.push_back(Pass(r, kv, b));
  }
  // 2. Several sequences in one batch: a decodes one token, b prefills 5.
  const SeqId s2 = kv.AddSequence();
  EXPECT_TRUE(kv.Reserve(a, 21).ok());
  EXPECT_TRUE(kv.Reserve(s2, 5).ok());
  {
    ForwardBatch b;
    const int32_t t1[] = {tok(20)}, p1[] = {20};
    b.AddSequence(a, t1, p1, 20, nullptr);
    std::vector<int32_t> t, p;
    for (int32_t i = 0; i < 5; ++i) t.push_back(tok(100 + i)), p.push_back(i);
    b.AddSequence(s2, t, p, 0, nullptr);
    b.logit_rows = {0, 5, 3};
    out.push_back(Pass(r, kv, b));
  }
  // 3. A token tree for a (depth-first, mask from parents, positions by depth).
  const std::vector<int32_t> parents = {-1, 0, 1, 0, 3, 3};
  const TreeMask mask = TreeMask::FromParents(parents);
  EXPECT_TRUE(kv.Reserve(a, 27).ok());
  {
    ForwardBatch b;
    const std::vector<int32_t> t = {tok(21), tok(22), tok(23), tok(24), tok(25), tok(26)};
    const std::vector<int32_t> p = {21, 22, 23, 22, 23, 23};
    b.AddSequence(a, t, p, 21, &mask);
    b.logit_rows = AllRows(b);
    out.push_back(Pass(r, kv, b));
  }
  // 4. Masked KV: s2 gets a level of two sibling entries, then their children see them only
  // through the mask.
  EXPECT_TRUE(kv.Reserve(s2, 7).ok());
  const TreeMask level1 = TreeMask::FromParents(std::vector<int32_t>{-1, -1});
  {
    ForwardBatch b;
    const int32_t t[] = {tok(105), tok(106)}, p[] = {5, 5};
    b.AddSequence(s2, t, p, 5, &level1);
    b.logit_rows = {0, 1};
    out.push_back(Pass(r, kv, b));
  }
  EXPECT_TRUE(kv.Reserve(s2, 10).ok());
  TreeMask level2 = TreeMask::Empty(3, 5);  // cols: 2 earlier entries + 3 new tokens
  level2.Set(0, 0), level2.Set(0, 2);
  level2.Set(1, 1), level2.Set(1, 3);
  level2.Set(2, 1), level2.Set(2, 3), level2.Set(2, 4);  // a grandchild of entry 1
  {
    ForwardBatch b;
    const int32_t t[] = {tok(107), tok(108), tok(109)}, p[] = {6, 6, 7};
    b.AddSequence(s2, t, p, 5, &level2, /*masked_kv=*/2);
    b.logit_rows = {2, 0, 1};
    out.push_back(Pass(r, kv, b));
  }
  // 5. Accept a's path 0 -> 3 -> 5 (layout 21, 24, 26): compact it, then decode after it.
  {
    const int32_t src[] = {24, 26}, dst[] = {22, 23};
    Status s = r.MoveKv(kv, a, src, dst);
    EXPECT_TRUE(s.ok()) << s.ToString();
    kv.Truncate(a, 24);
    EXPECT_TRUE(kv.Reserve(a, 25).ok());
    ForwardBatch b;
    const int32_t t[] = {tok(27)}, p[] = {24};
    b.AddSequence(a, t, p, 24, nullptr);
    b.logit_rows = {0};
    out.push_back(Pass(r, kv, b));
  }
  kv.RemoveSequence(a);
  kv.RemoveSequence(s2);
  return out;
}

}  // namespace specinfer::testing
