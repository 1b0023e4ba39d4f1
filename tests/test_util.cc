#include "test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/simd.h"
#include "model/gguf_writer.h"
#include "sampling/sampler.h"

namespace specinfer::testing {

namespace {

// CTest runs some test binaries again with a kernel set switched off (SPECINFER_NO_AVX512 or
// SPECINFER_NO_AVX2, tests/CMakeLists.txt). On a CPU without that set the run would repeat the
// default one test for test: it runs no test and reports itself skipped, saying why. (GoogleTest
// 1.12 prints no "[  SKIPPED ]" line for a skip in a global set-up, the line CTest looks for, so
// it is printed here.)
class RepeatedKernelSetRun : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto& f = cpu::GetCpuFeatures();
    auto set = [](const char* name) {
      const char* v = std::getenv(name);
      return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
    };
    const char* why = nullptr;
    if (set("SPECINFER_NO_AVX2") && !(f.avx2 && f.fma && f.f16c)) {
      why =
          "SPECINFER_NO_AVX2 on a CPU without AVX2/FMA/F16C: the default run already took "
          "these tests through the portable kernels";
    } else if (set("SPECINFER_NO_AVX512") && !set("SPECINFER_NO_AVX2") &&
               !(f.avx512f && f.avx512vl && f.avx512bw && f.avx512vnni)) {
      why =
          "SPECINFER_NO_AVX512 on a CPU without AVX-512 F/VL/BW/VNNI: the default run already "
          "took these tests through the AVX2 kernels";
    }
    if (why != nullptr) {
      std::printf("[  SKIPPED ] every test of this run: %s\n", why);
      std::fflush(stdout);
      GTEST_SKIP() << why;
    }
  }
};

[[maybe_unused]] ::testing::Environment* const kRepeatedKernelSetRun =
    ::testing::AddGlobalTestEnvironment(new RepeatedKernelSetRun);

}  // namespace

std::string SourcePath(const std::string& relative) {
  return std::string(SPECINFER_SOURCE_DIR) + "/" + relative;
}

std::string Stories260KModel() { return SourcePath("tests/data/stories260K/stories260K.bin"); }
std::string Stories260KTokenizer() { return SourcePath("tests/data/stories260K/tok512.bin"); }

static std::string FirstExisting(const std::string& a, const std::string& b) {
  if (std::filesystem::exists(a)) return a;
  if (std::filesystem::exists(b)) return b;
  return "";
}

std::string Llama2TokenizerBin() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.bin"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.bin"));
}
std::string Llama2TokenizerModel() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.model"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.model"));
}

std::string DefaultModel() {
  std::string p = SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  return std::filesystem::exists(p) ? p : "";
}

std::vector<float> DecodeBase64Floats(std::string_view b64) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : b64) {
    size_t v = kAlphabet.find(ch);
    if (v == std::string_view::npos) continue;  // '=' padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

namespace {
std::filesystem::path ScratchRoot() {
  return std::filesystem::temp_directory_path() /
         ("specinfer_test_" + std::to_string(::getpid()));
}
// Removes this process's scratch folder when the test binary exits.
struct RemoveScratchRoot {
  ~RemoveScratchRoot() {
    std::error_code ec;
    std::filesystem::remove_all(ScratchRoot(), ec);
  }
} remove_scratch_root;
}  // namespace

std::filesystem::path ScratchDir(const std::string& name) {
  std::filesystem::path dir = ScratchRoot() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

std::vector<float> PromptLogits(ModelRunner& runner, KvCacheManager& kv,
                                const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& rows) {
  SeqId s = kv.AddSequence();
  Status reserved = kv.Reserve(s, static_cast<int32_t>(tokens.size()));
  EXPECT_TRUE(reserved.ok()) << reserved.ToString();
  if (!reserved.ok()) return {};
  ForwardBatch b;
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  b.AddSequence(s, tokens, pos, 0, nullptr);
  b.logit_rows = rows;
  std::vector<float> logits(rows.size() * runner.model().config().vocab_size);
  Status st = runner.Forward(b, kv, logits);
  kv.RemoveSequence(s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok() ? logits : std::vector<float>();
}

void ExpectArgmaxRowsMatchLogits(ModelRunner& runner, KvCacheManager& kv,
                                 const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int32_t>(tokens.size());
  ASSERT_GE(n, 6);
  const int32_t vocab = runner.model().config().vocab_size;
  const auto row_floats = static_cast<size_t>(vocab);
  // Two passes of one sequence: the prompt but its last four tokens (causal), then those four as
  // a tree after it (nodes 2 and 3 both children of node 1). Rows are numbered 0..n-1 over both.
  const int32_t prefix = n - 4;
  const std::vector<int32_t> parents = {-1, 0, 1, 1};
  const TreeMask mask = TreeMask::FromParents(parents);

  // Runs both passes asking for `logit_rows` and `argmax_rows` (ForwardArgmax if `argmax`);
  // fills `logits` ([logit_rows, vocab]) and `ids` ([argmax_rows]) in the order asked.
  auto run = [&](bool argmax, const std::vector<int32_t>& logit_rows,
                 const std::vector<int32_t>& argmax_rows, std::vector<float>* logits,
                 std::vector<int32_t>* ids) {
    logits->assign(logit_rows.size() * row_floats, 0.0f);
    ids->assign(argmax_rows.size(), -1);
    const SeqId s = kv.AddSequence();
    Status st = kv.Reserve(s, n);
    for (int pass = 0; pass < 2 && st.ok(); ++pass) {
      const int32_t begin = pass == 0 ? 0 : prefix, end = pass == 0 ? prefix : n;
      std::vector<int32_t> toks(tokens.begin() + begin, tokens.begin() + end), pos;
      for (int32_t i = begin; i < end; ++i)
        pos.push_back(pass == 0 ? i : prefix + std::min(i - prefix, 2));
      ForwardBatch b;
      b.AddSequence(s, toks, pos, begin, pass == 0 ? nullptr : &mask);
      std::vector<size_t> lwhere, awhere;  // where each of the pass's rows goes
      for (size_t i = 0; i < logit_rows.size(); ++i)
        if (logit_rows[i] >= begin && logit_rows[i] < end) {
          b.logit_rows.push_back(logit_rows[i] - begin);
          lwhere.push_back(i);
        }
      for (size_t i = 0; i < argmax_rows.size(); ++i)
        if (argmax_rows[i] >= begin && argmax_rows[i] < end) {
          b.argmax_rows.push_back(argmax_rows[i] - begin);
          awhere.push_back(i);
        }
      std::vector<float> l(b.logit_rows.size() * row_floats);
      std::vector<int32_t> a(b.argmax_rows.size());
      st = argmax ? runner.ForwardArgmax(b, kv, l, a) : runner.Forward(b, kv, l);
      for (size_t i = 0; i < lwhere.size(); ++i)
        std::copy_n(l.begin() + static_cast<ptrdiff_t>(i * row_floats), row_floats,
                    logits->begin() + static_cast<ptrdiff_t>(lwhere[i] * row_floats));
      for (size_t i = 0; i < awhere.size(); ++i) (*ids)[awhere[i]] = a[i];
    }
    kv.RemoveSequence(s);
    return st;
  };

  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  std::vector<float> want;
  std::vector<int32_t> none;
  Status st = run(false, all, {}, &want, &none);
  ASSERT_TRUE(st.ok()) << st.ToString();

  // Argmax rows in shuffled order, and two logits rows beside them.
  std::vector<int32_t> argmax_rows(all.rbegin(), all.rend());
  std::swap(argmax_rows[1], argmax_rows[static_cast<size_t>(n) - 2]);
  const std::vector<int32_t> logit_rows = {n - 2, 1};
  std::vector<float> got;
  std::vector<int32_t> ids;
  st = run(true, logit_rows, argmax_rows, &got, &ids);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < argmax_rows.size(); ++i) {
    const std::span<const float> row(want.data() + argmax_rows[i] * row_floats, row_floats);
    EXPECT_EQ(ids[i], Argmax(row)) << "argmax row " << argmax_rows[i];
  }
  for (size_t i = 0; i < logit_rows.size(); ++i)
    EXPECT_EQ(std::memcmp(got.data() + i * row_floats, want.data() + logit_rows[i] * row_floats,
                          row_floats * sizeof(float)),
              0)
        << "logits row " << logit_rows[i];

  // A batch with argmax rows is ForwardArgmax's, not Forward's.
  const SeqId s = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(s, 1).ok());
  ForwardBatch b;
  b.AddSequence(s, std::vector<int32_t>{tokens[0]}, std::vector<int32_t>{0}, 0, nullptr);
  b.argmax_rows = {0};
  std::vector<float> l;
  st = runner.Forward(b, kv, l);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  kv.RemoveSequence(s);
}

void WriteDraftVocabGguf(const std::string& llama2c_path, const std::vector<int32_t>& table,
                         const std::filesystem::path& path, std::optional<uint64_t> fingerprint) {
  std::ifstream in(llama2c_path, std::ios::binary);
  int32_t h[7];
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4],
                vocab = std::abs(h[5]), seq = h[6];
  const int64_t kv_dim = dim / heads * kv_heads;
  auto read = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(v.data()), n * 4);
    return v;
  };
  const std::vector<float> emb = read(vocab * dim), rms_att = read(layers * dim),
                           wq = read(layers * dim * dim), wk = read(layers * kv_dim * dim),
                           wv = read(layers * kv_dim * dim), wo = read(layers * dim * dim),
                           rms_ffn = read(layers * dim), w1 = read(layers * hidden * dim),
                           w2 = read(layers * dim * hidden), w3 = read(layers * hidden * dim),
                           rms_final = read(dim);
  ASSERT_TRUE(in.good()) << llama2c_path << " is shorter than its header says";
  std::vector<float> rows(table.size() * static_cast<size_t>(dim), 0.0f);
  for (size_t r = 0; r < table.size(); ++r)  // ids outside the checkpoint (bad tables): zeros
    if (table[r] >= 0 && table[r] < vocab)
      std::memcpy(&rows[r * dim], &emb[static_cast<size_t>(table[r]) * dim], dim * 4);
  GgufWriter g;
  g.KvString("general.architecture", "llama");
  g.KvU32("llama.block_count", static_cast<uint32_t>(layers));
  g.KvU32("llama.context_length", static_cast<uint32_t>(seq));
  g.KvU32("llama.embedding_length", static_cast<uint32_t>(dim));
  g.KvU32("llama.feed_forward_length", static_cast<uint32_t>(hidden));
  g.KvU32("llama.attention.head_count", static_cast<uint32_t>(heads));
  g.KvU32("llama.attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  g.KvF32("llama.rope.freq_base", 10000.0f);
  g.KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  g.KvI32Array("specinfer.draft_token_ids", table);
  if (fingerprint) g.KvU64("specinfer.vocab_fingerprint", *fingerprint);
  g.Tensor("token_embd.weight", {dim, static_cast<int64_t>(table.size())}, rows.data());
  g.Tensor("output_norm.weight", {dim}, rms_final.data());
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    g.Tensor(p + "attn_norm.weight", {dim}, &rms_att[l * dim]);
    g.Tensor(p + "attn_q.weight", {dim, dim}, &wq[l * dim * dim]);
    g.Tensor(p + "attn_k.weight", {dim, kv_dim}, &wk[l * kv_dim * dim]);
    g.Tensor(p + "attn_v.weight", {dim, kv_dim}, &wv[l * kv_dim * dim]);
    g.Tensor(p + "attn_output.weight", {dim, dim}, &wo[l * dim * dim]);
    g.Tensor(p + "ffn_norm.weight", {dim}, &rms_ffn[l * dim]);
    g.Tensor(p + "ffn_gate.weight", {dim, hidden}, &w1[l * hidden * dim]);
    g.Tensor(p + "ffn_down.weight", {hidden, dim}, &w2[l * dim * hidden]);
    g.Tensor(p + "ffn_up.weight", {dim, hidden}, &w3[l * hidden * dim]);
  }
  WriteFile(path, g.Finish());
}

std::vector<float> LastLogits(std::shared_ptr<const Model> model,
                              const std::vector<int32_t>& tokens) {
  CpuRunnerOptions o;
  o.num_threads = 1;
  o.kv_block_size = 16;
  o.num_kv_blocks = static_cast<int32_t>(tokens.size()) / 16 + 1;
  auto runner = CpuModelRunner::Create(std::move(model), o);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return {};
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  return PromptLogits(**runner, kv, tokens, {static_cast<int32_t>(tokens.size()) - 1});
}

}  // namespace specinfer::testing
