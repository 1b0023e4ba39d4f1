// Faults of an LLM worker group: malformed messages are rejected (INVALID_ARGUMENT) and the
// worker goes on serving; a worker that goes down makes the passes in flight fail quickly with
// an error naming it while the manager keeps accepting work; when it comes back (same port) the
// group is re-formed, new sequences generate exactly as before and a sequence whose KV predates
// the restart gets a clear KV-lost error.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "dist/model_identity.h"
#include "engine/engine_core.h"
#include "llm_test_util.h"
#include "model/loader.h"
#include "proto/llm_worker.grpc.pb.h"
#include "test_util.h"

namespace specinfer {
namespace {

namespace pb = ::specinfer::worker;
using Clock = std::chrono::steady_clock;

struct Stories {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  uint64_t fingerprint = 0;
};

Stories LoadStories() {
  auto loaded =
      LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  Stories s;
  s.fingerprint = VocabFingerprint(*loaded->tokenizer);
  s.model = std::shared_ptr<const Model>(std::move(loaded->model));
  s.tokenizer = std::shared_ptr<const Tokenizer>(std::move(loaded->tokenizer));
  return s;
}

// A valid request: one sequence of 3 prompt tokens in block 0.
pb::LlmForwardRequest ValidRequest(uint64_t epoch) {
  pb::LlmForwardRequest r;
  r.set_epoch(epoch);
  r.set_kv_block_size(16);
  r.set_batch_invariant(true);
  for (int i = 0; i < 3; ++i) {
    r.add_tokens(10 + i);
    r.add_positions(i);
  }
  pb::LlmSequence* s = r.add_seqs();
  s->set_seq(77);
  s->set_token_begin(0);
  s->set_token_count(3);
  s->add_block_table(0);
  r.add_logit_rows(2);
  return r;
}

// Readies a context for a test's direct call to a worker: the call waits through a transient
// connect failure (each call may open a fresh channel while other tests load the machine) up to
// a deadline, rather than failing at once with UNAVAILABLE.
void DirectCall(grpc::ClientContext& ctx) {
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

// Sends `req` to every worker of the group (so none waits in a collective for the others).
std::vector<grpc::Status> ForwardToAll(const testing::LlmTestGroup& g,
                                       const pb::LlmForwardRequest& req) {
  std::vector<grpc::Status> out(g.addresses.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < g.addresses.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stub = pb::LlmWorker::NewStub(
          grpc::CreateChannel(g.addresses[i], grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      DirectCall(ctx);
      pb::LlmForwardResponse resp;
      out[i] = stub->Forward(&ctx, req, &resp);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(LlmWorkerValidation, MalformedMessagesAreRejectedAndTheWorkerKeepsServing) {
  const Stories st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 2);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  const uint64_t epoch = (*remote)->epoch();

  // The valid request itself is accepted by all.
  for (const grpc::Status& s : ForwardToAll(*group, ValidRequest(epoch)))
    EXPECT_TRUE(s.ok()) << s.error_message();

  struct Case {
    const char* name;
    std::function<void(pb::LlmForwardRequest&)> mutate;
  };
  const Case cases[] = {
      {"block id beyond capacity", [](auto& r) { r.mutable_seqs(0)->set_block_table(0, 1 << 20); }},
      {"negative block id", [](auto& r) { r.mutable_seqs(0)->set_block_table(0, -1); }},
      {"table too short for kv_prefix", [](auto& r) { r.mutable_seqs(0)->set_kv_prefix(40); }},
      {"mask columns do not match",
       [](auto& r) {
         auto* s = r.mutable_seqs(0);
         s->set_has_mask(true);
         s->set_mask_cols(4);
         for (int i = 0; i < 3; ++i) s->add_mask_bits(1);
       }},
      {"mask bits do not match rows",
       [](auto& r) {
         auto* s = r.mutable_seqs(0);
         s->set_has_mask(true);
         s->set_mask_cols(3);
         s->add_mask_bits(1);
       }},
      {"masked KV without a mask", [](auto& r) { r.mutable_seqs(0)->set_masked_kv(1); }},
      {"token outside the vocabulary", [](auto& r) { r.set_tokens(1, 512); }},
      {"negative token", [](auto& r) { r.set_tokens(0, -3); }},
      {"sequence does not start at its token",
       [](auto& r) { r.mutable_seqs(0)->set_token_begin(1); }},
      {"sequence longer than the batch", [](auto& r) { r.mutable_seqs(0)->set_token_count(4); }},
      {"negative kv prefix", [](auto& r) { r.mutable_seqs(0)->set_kv_prefix(-1); }},
      {"positions and tokens differ", [](auto& r) { r.add_positions(3); }},
      {"negative position", [](auto& r) { r.set_positions(0, -1); }},
      {"logit row out of range", [](auto& r) { r.set_logit_rows(0, 3); }},
      {"more logits rows than tokens",
       [](auto& r) { r.add_logit_rows(0), r.add_logit_rows(1), r.add_logit_rows(2); }},
      {"other KV block size", [](auto& r) { r.set_kv_block_size(32); }},
      {"tokens not covered by sequences", [](auto& r) { r.add_tokens(1), r.add_positions(3); }},
      {"distribution row without its settings", [](auto& r) { r.add_dist_rows(0); }},
      {"distribution row out of range",
       [](auto& r) {
         r.add_dist_rows(3);
         r.add_dist_settings()->set_temperature(1);
       }},
      {"distribution settings out of range",
       [](auto& r) {
         r.add_dist_rows(0);
         r.add_dist_settings()->set_top_p(1.5f);
       }},
  };
  for (const Case& c : cases) {
    pb::LlmForwardRequest req = ValidRequest(epoch);
    c.mutate(req);
    for (const grpc::Status& s : ForwardToAll(*group, req))
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name << ": "
                                                                    << s.error_message();
  }
  // A request for another epoch is refused, not run.
  for (const grpc::Status& s : ForwardToAll(*group, ValidRequest(epoch + 5)))
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();

  // MoveKv and Join are checked too.
  auto stub = pb::LlmWorker::NewStub(
      grpc::CreateChannel(group->addresses[0], grpc::InsecureChannelCredentials()));
  {
    pb::LlmMoveKvRequest m;
    m.set_epoch(epoch);
    m.set_kv_block_size(16);
    m.add_block_table(0);
    m.set_length(16);
    m.add_src(3);
    m.add_dst(16);  // beyond the sequence's length
    grpc::ClientContext ctx;
    DirectCall(ctx);
    pb::LlmMoveKvResponse resp;
    EXPECT_EQ(stub->MoveKv(&ctx, m, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    m.set_dst(0, 2);
    m.set_block_table(0, 99999);
    grpc::ClientContext ctx2;
    DirectCall(ctx2);
    EXPECT_EQ(stub->MoveKv(&ctx2, m, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    pb::LlmJoinRequest j;  // epoch 0, no workers
    grpc::ClientContext ctx;
    DirectCall(ctx);
    pb::LlmJoinResponse resp;
    EXPECT_EQ(stub->Join(&ctx, j, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  // The group still serves, bit-exactly.
  auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
  KvCacheManager kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  const auto want = testing::RunScenario(*local.runner, *local.kv);
  const auto got = testing::RunScenario(**remote, kv);
  EXPECT_EQ(got, want);
  EXPECT_EQ((*remote)->epoch(), epoch);  // never re-formed
}

// A peer that never enters the collective (it got no Forward): the waiting worker gives up after
// the group's collective timeout (ABORTED), leaves the group, and accepts the next Join.
TEST(LlmWorkerFaults, CollectiveWithAnAbsentPeerTimesOutAndTheWorkerRejoins) {
  const Stories st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto stub = pb::LlmWorker::NewStub(
      grpc::CreateChannel(group->addresses[0], grpc::InsecureChannelCredentials()));
  const auto t0 = Clock::now();
  grpc::ClientContext ctx;
  DirectCall(ctx);
  pb::LlmForwardResponse resp;
  grpc::Status s = stub->Forward(&ctx, ValidRequest((*remote)->epoch()), &resp);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_GE(waited, 2.5);  // the group's collective timeout is 3 s
  EXPECT_LT(waited, 10.0);
  grpc::ClientContext hctx;
  DirectCall(hctx);
  pb::LlmHealthResponse health;
  ASSERT_TRUE(stub->Health(&hctx, pb::LlmHealthRequest(), &health).ok());
  EXPECT_FALSE(health.in_group());

  // The manager notices on its next probe, re-forms, and the group computes exactly again.
  Status probe = (*remote)->Probe();
  ASSERT_TRUE(probe.ok()) << probe.ToString();
  auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
  KvCacheManager kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  EXPECT_EQ(testing::RunScenario(**remote, kv), testing::RunScenario(*local.runner, *local.kv));
}

struct Outcome {
  std::optional<StatusOr<GenerateResult>> done;
};

GenerateRequest Request(const Stories& st, const std::string& text, int32_t tokens) {
  GenerateRequest r;
  r.prompt_tokens = *st.tokenizer->Encode(text, true);
  r.max_new_tokens = tokens;
  return r;
}

// Steps `gen` until `out` is done (at most `limit`); returns the seconds it took.
double StepUntilDone(EngineCore& gen, Outcome& out, double limit = 20) {
  const auto t0 = Clock::now();
  double s = 0;
  while (!out.done && s < limit) {
    gen.Step();
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return s;
}

TEST(LlmWorkerFaults, WorkerDownFailsInFlightQuicklyAndServingResumesWhenItReturns) {
  const Stories st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 2);
  ASSERT_TRUE(group);
  auto connected = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  RemoteLlmRunner& remote = **connected;
  KvCacheManager kv(remote.num_kv_blocks(), remote.kv_block_size());
  auto local = testing::MakeLocalRunner(st.model, remote.num_kv_blocks());
  const uint64_t epoch0 = remote.epoch();

  // An old sequence with KV on the group, driven directly.
  const SeqId old_seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(old_seq, 8).ok());
  {
    ForwardBatch b;
    const std::vector<int32_t> t = {1, 20, 30, 40, 50, 60, 70, 80}, p = {0, 1, 2, 3, 4, 5, 6, 7};
    b.AddSequence(old_seq, t, p, 0, nullptr);
    b.logit_rows = {7};
    testing::Pass(remote, kv, b);
  }

  BatchOptions o;
  o.max_sequences = 4;
  EngineCore gen(remote, kv, o);
  Outcome r1;
  ASSERT_TRUE(gen.Add(Request(st, "Once upon a time", 60), nullptr,
                      [&](StatusOr<GenerateResult> r) { r1.done = r; })
                  .ok());
  for (int i = 0; i < 4; ++i) gen.Step();
  ASSERT_FALSE(r1.done.has_value());
  // Another engine core's sequence with KV on the group, not in any pass while the worker is down.
  EngineCore gen2(remote, kv, o);
  Outcome old_run;
  ASSERT_TRUE(gen2.Add(Request(st, "Lily and Ben", 30), nullptr,
                       [&](StatusOr<GenerateResult> r) { old_run.done = r; })
                  .ok());
  for (int i = 0; i < 3; ++i) gen2.Step();
  ASSERT_FALSE(old_run.done.has_value());

  // Stage 1, tp 1 goes down while r1 is decoding.
  const std::string down = group->addresses[3];
  group->workers[3]->Shutdown();
  group->workers[3].reset();
  const double failed_after = StepUntilDone(gen, r1);
  ASSERT_TRUE(r1.done.has_value());
  ASSERT_FALSE(r1.done->ok());
  EXPECT_EQ(r1.done->status().code(), StatusCode::kUnavailable) << r1.done->status().ToString();
  EXPECT_NE(r1.done->status().message().find("LLM worker " + down + " (stage 1, tp 1)"),
            std::string::npos)
      << r1.done->status().message();
  EXPECT_LT(failed_after, 5.0);

  // The manager keeps accepting; requests meanwhile fail fast, naming the worker.
  Outcome r2;
  auto admitted = gen.Add(Request(st, "The cat", 10), nullptr,
                          [&](StatusOr<GenerateResult> r) { r2.done = r; });
  ASSERT_TRUE(admitted.ok());
  EXPECT_EQ(*admitted, EngineCore::Admission::kAdmitted);
  const double refused_after = StepUntilDone(gen, r2);
  ASSERT_TRUE(r2.done.has_value());
  EXPECT_EQ(r2.done->status().code(), StatusCode::kUnavailable) << r2.done->status().ToString();
  EXPECT_NE(r2.done->status().message().find(down), std::string::npos);
  EXPECT_LT(refused_after, 3.0);
  EXPECT_FALSE(remote.Probe().ok());

  // The worker comes back on the same port; the manager's probes re-form the group.
  ASSERT_TRUE(group->StartWorker(3).ok());
  Status probe = remote.Probe();
  for (int i = 0; i < 50 && !probe.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    probe = remote.Probe();
  }
  ASSERT_TRUE(probe.ok()) << probe.ToString();
  EXPECT_GT(remote.epoch(), epoch0);

  // The old sequence's KV is gone: a clear error, not garbage.
  {
    ASSERT_TRUE(kv.Reserve(old_seq, 9).ok());
    ForwardBatch b;
    const int32_t t[] = {90}, p[] = {8};
    b.AddSequence(old_seq, t, p, 8, nullptr);
    b.logit_rows = {0};
    std::vector<float> logits(st.model->config().vocab_size);
    Status s = remote.Forward(b, kv, logits);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("KV lost"), std::string::npos) << s.message();
    kv.RemoveSequence(old_seq);
  }

  // New requests generate exactly what the local engine generates, also beside a sequence of
  // before the failure, which ends with KV lost before its next pass instead of joining it.
  GenerateRequest req = Request(st, "Once upon a time", 40);
  Outcome r3;
  ASSERT_TRUE(gen2.Add(req, nullptr, [&](StatusOr<GenerateResult> r) { r3.done = r; }).ok());
  StepUntilDone(gen2, r3);
  ASSERT_TRUE(old_run.done.has_value());
  EXPECT_EQ(old_run.done->status().code(), StatusCode::kDataLoss)
      << old_run.done->status().ToString();
  EXPECT_NE(old_run.done->status().message().find("KV lost"), std::string::npos);
  ASSERT_TRUE(r3.done.has_value());
  ASSERT_TRUE(r3.done->ok()) << r3.done->status().ToString();
  EngineCore local_gen(*local.runner, *local.kv, o);
  Outcome want;
  ASSERT_TRUE(local_gen.Add(req, nullptr, [&](StatusOr<GenerateResult> r) { want.done = r; }).ok());
  StepUntilDone(local_gen, want);
  ASSERT_TRUE(want.done && want.done->ok());
  EXPECT_EQ((*r3.done)->tokens, (*want.done)->tokens);
  EXPECT_EQ((*r3.done)->tokens.size(), 40u);
}

// Prefix caching across a worker restart: the manager forgets the cached blocks when the group's
// KV is lost (kv_epoch changes), so a prompt cached before is prefilled again rather than read
// from entries that are gone; afterwards it is cached again. Output equals the first run's.
TEST(LlmWorkerFaults, PrefixCacheIsForgottenWhenAWorkerRestarts) {
  const Stories st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
  ASSERT_TRUE(group);
  auto connected = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  RemoteLlmRunner& remote = **connected;
  KvCacheManager kv(remote.num_kv_blocks(), remote.kv_block_size());
  BatchOptions o;
  o.max_sequences = 2;
  EngineCore gen(remote, kv, o);
  const GenerateRequest req = Request(
      st, "Lily and Ben went to the park. They saw a big dog. The dog was happy and ran to them.",
      20);
  auto run = [&](Outcome& out) {
    ASSERT_TRUE(gen.Add(req, nullptr, [&](StatusOr<GenerateResult> r) { out.done = r; }).ok());
    StepUntilDone(gen, out);
    ASSERT_TRUE(out.done.has_value());
    ASSERT_TRUE(out.done->ok()) << out.done->status().ToString();
  };
  Outcome first;
  run(first);
  EXPECT_GT(kv.prefix_stats().cached_blocks, 0);

  group->workers[1]->Shutdown();
  group->workers[1].reset();
  EXPECT_FALSE(remote.Probe().ok());
  ASSERT_TRUE(group->StartWorker(1).ok());
  Status probe = remote.Probe();
  for (int i = 0; i < 50 && !probe.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    probe = remote.Probe();
  }
  ASSERT_TRUE(probe.ok()) << probe.ToString();

  Outcome second, third;
  run(second);
  EXPECT_EQ((*second.done)->stats.cached_prompt_tokens, 0);
  EXPECT_EQ((*second.done)->tokens, (*first.done)->tokens);
  run(third);
  EXPECT_GT((*third.done)->stats.cached_prompt_tokens, 0);
  EXPECT_EQ((*third.done)->tokens, (*first.done)->tokens);
}

TEST(LlmWorkerFaults, RendezvousWorkerRestartAndDrain) {
  // Worker 0 also serves the group's rendezvous store: it restarts between passes (no failed
  // pass seen by the manager), and the next pass still reports it and re-forms afterwards.
  const Stories st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
  ASSERT_TRUE(group);
  auto connected = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  RemoteLlmRunner& remote = **connected;
  KvCacheManager kv(remote.num_kv_blocks(), remote.kv_block_size());
  const SeqId seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(seq, 4).ok());
  ForwardBatch b;
  const int32_t t[] = {1, 2, 3, 4}, p[] = {0, 1, 2, 3};
  b.AddSequence(seq, t, p, 0, nullptr);
  b.logit_rows = {3};
  testing::Pass(remote, kv, b);

  group->workers[0]->Shutdown();
  group->workers[0].reset();
  ASSERT_TRUE(group->StartWorker(0).ok());
  // A decode of the sequence: the restarted worker is not in the group, its KV is gone.
  ASSERT_TRUE(kv.Reserve(seq, 5).ok());
  ForwardBatch d;
  const int32_t t2[] = {5}, p2[] = {4};
  d.AddSequence(seq, t2, p2, 4, nullptr);
  d.logit_rows = {0};
  std::vector<float> logits(st.model->config().vocab_size);
  Status s = remote.Forward(d, kv, logits);
  for (int i = 0; i < 20 && s.code() == StatusCode::kUnavailable &&
                  s.message().find("unavailable") != std::string::npos;
       ++i) {  // the channel may still be reconnecting
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s = remote.Forward(d, kv, logits);
  }
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("KV lost"), std::string::npos) << s.message();
  kv.RemoveSequence(seq);

  // A fresh sequence runs on the re-formed group and matches the local runner.
  auto local = testing::MakeLocalRunner(st.model, remote.num_kv_blocks());
  const auto want = testing::RunScenario(*local.runner, *local.kv);
  const auto got = testing::RunScenario(remote, kv);
  EXPECT_EQ(got, want);

  // A draining worker takes no more work, and says who it is.
  auto stub = pb::LlmWorker::NewStub(
      grpc::CreateChannel(group->addresses[1], grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  DirectCall(ctx);
  pb::LlmDrainResponse dr;
  ASSERT_TRUE(stub->Drain(&ctx, pb::LlmDrainRequest(), &dr).ok());
  const SeqId fresh = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(fresh, 4).ok());
  ForwardBatch f;
  f.AddSequence(fresh, t, p, 0, nullptr);
  f.logit_rows = {3};
  Status drained = remote.Forward(f, kv, logits);
  EXPECT_EQ(drained.code(), StatusCode::kUnavailable) << drained.ToString();
  EXPECT_NE(drained.message().find(group->addresses[1]), std::string::npos) << drained.message();
}

}  // namespace
}  // namespace specinfer
