// Decoder families against their reference implementation: tiny random models written by
// Hugging Face transformers (tests/reference/make_arch_models.py -> tests/data/arch/NAME: Llama
// 3 RoPE scaling, Qwen2 biases, Qwen3 QK-norm, Mistral sliding window, Gemma 2 soft-capping and
// post-norms, Gemma 3 QK-norm and local RoPE base) load through the Hugging Face loader and give
// transformers' logits for every position of a 12-token prompt, within
//   |ours - reference| <= 1e-4 * max|reference| + 1e-5
// (both float32; only the summation order differs). Decoding the same tokens one at a time must
// give the prompt pass's logits bit for bit (the batch invariance speculative decoding relies on,
// here through the sliding-window and soft-capping paths). Llama 3 (rope_freqs tensor), Qwen3 and
// Gemma 3 also as GGUF files written the way llama.cpp's converter writes them, through the GGUF
// loader.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_runner.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/gguf_loader.h"
#include "model/hf_loader.h"
#include "test_util.h"

namespace specinfer {
namespace {

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [tokens][vocab]
};

Reference LoadReference(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  return Reference{j["tokens"].get<std::vector<int32_t>>(),
                   j["logits"].get<std::vector<std::vector<float>>>()};
}

class ArchReference : public ::testing::TestWithParam<const char*> {};

// "NAME": the Hugging Face directory; "NAME.gguf": the same weights as GGUF (NAME/model.gguf).
StatusOr<std::unique_ptr<Model>> LoadFamily(const std::string& param) {
  const bool gguf = param.size() > 5 && param.substr(param.size() - 5) == ".gguf";
  const std::string dir = testing::SourcePath(
      "tests/data/arch/" + (gguf ? param.substr(0, param.size() - 5) : param));
  if (!gguf) return ModelFromHfDirectory(dir);
  SI_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, GgufFile::Open(dir + "/model.gguf"));
  return ModelFromGguf(*g);
}

TEST_P(ArchReference, MatchesTransformersLogits) {
  const std::string param = GetParam();
  const std::string dir = testing::SourcePath(
      "tests/data/arch/" + param.substr(0, param.find('.')));
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors"))
      << dir << " is missing; run tests/reference/make_arch_models.py";
  StatusOr<std::unique_ptr<Model>> m = LoadFamily(param);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::shared_ptr<const Model> model = std::move(m).value();
  const Reference ref = LoadReference(dir);
  const int32_t n = static_cast<int32_t>(ref.tokens.size());
  const int32_t vocab = model->config().vocab_size;
  ASSERT_EQ(ref.logits.size(), size_t(n));
  ASSERT_EQ(ref.logits[0].size(), size_t(vocab));

  CpuRunnerOptions o;
  o.num_threads = 2;
  o.kv_block_size = 4;  // several blocks: the window crosses block boundaries
  o.num_kv_blocks = 8;
  auto runner = CpuModelRunner::Create(model, o);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  KvCacheManager kv(o.num_kv_blocks, o.kv_block_size);
  std::vector<int32_t> rows(n);
  for (int32_t i = 0; i < n; ++i) rows[i] = i;
  const std::vector<float> got = testing::PromptLogits(**runner, kv, ref.tokens, rows);
  ASSERT_EQ(got.size(), size_t(n) * vocab);

  double max_ref = 0, max_err = 0;
  for (const auto& row : ref.logits)
    for (float v : row) max_ref = std::max(max_ref, std::fabs(double(v)));
  const double tol = 1e-4 * max_ref + 1e-5;
  int bad = 0;
  for (int32_t t = 0; t < n; ++t) {
    for (int32_t v = 0; v < vocab; ++v) {
      const double err = std::fabs(double(got[t * vocab + v]) - ref.logits[t][v]);
      max_err = std::max(max_err, err);
      if (err > tol && bad++ < 5) {
        ADD_FAILURE() << GetParam() << ": position " << t << " token " << v << ": got "
                      << got[t * vocab + v] << ", transformers " << ref.logits[t][v];
      }
    }
  }
  EXPECT_EQ(bad, 0) << "max error " << max_err << " (tolerance " << tol << ")";
  RecordProperty("max_abs_error", std::to_string(max_err));

  // Incremental decoding of the same tokens: the prompt pass's logits bit for bit.
  SeqId s = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(s, n).ok());
  std::vector<float> step(vocab);
  for (int32_t i = 0; i < n; ++i) {
    ForwardBatch b;
    const std::vector<int32_t> tok = {ref.tokens[i]}, pos = {i};
    b.AddSequence(s, tok, pos, i, nullptr);
    b.logit_rows = {0};
    ASSERT_TRUE((*runner)->Forward(b, kv, step).ok());
    for (int32_t v = 0; v < vocab; ++v) {
      ASSERT_EQ(std::bit_cast<uint32_t>(step[v]), std::bit_cast<uint32_t>(got[i * vocab + v]))
          << GetParam() << ": decode step " << i << " token " << v;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ArchReference,
                         ::testing::Values("llama3", "qwen2", "qwen3", "mistral", "gemma2",
                                           "gemma3", "llama3.gguf", "qwen3.gguf", "gemma3.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           if (n.find('.') != std::string::npos) n.replace(n.find('.'), 1, "_");
                           return n;
                         });

// The configs turn on what each family needs (so a test passing does not mean a switch is dead).
TEST(ArchReference, ConfigsUseTheirFeatures) {
  auto config = [](const char* name) {
    auto m = ModelFromHfDirectory(testing::SourcePath(std::string("tests/data/arch/") + name));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? (*m)->config() : ModelConfig{};
  };
  EXPECT_EQ(config("llama3").rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_TRUE(config("qwen2").attention_bias);
  EXPECT_TRUE(config("qwen3").qk_norm);
  const ModelConfig mistral = config("mistral");
  EXPECT_EQ(mistral.sliding_window, 5);
  EXPECT_TRUE(mistral.IsSlidingLayer(0) && mistral.IsSlidingLayer(2));
  const ModelConfig g2 = config("gemma2");
  EXPECT_TRUE(g2.post_norms && !g2.qk_norm);
  EXPECT_EQ(g2.ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_EQ(g2.attn_softcap, 3.0f);
  EXPECT_EQ(g2.final_softcap, 5.0f);
  EXPECT_TRUE(g2.IsSlidingLayer(0) && !g2.IsSlidingLayer(1) && g2.IsSlidingLayer(2));
  const ModelConfig g3 = config("gemma3");
  EXPECT_TRUE(g3.post_norms && g3.qk_norm);
  EXPECT_EQ(g3.rope_theta_local, 100.0f);
  EXPECT_EQ(g3.rope_theta, 1000000.0f);
  EXPECT_TRUE(g3.IsSlidingLayer(1) && !g3.IsSlidingLayer(2) && g3.IsSlidingLayer(3));
}

}  // namespace
}  // namespace specinfer
