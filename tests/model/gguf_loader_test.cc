// GGUF models: the same random weights written by the test as a GGUF file and as a llama2.c
// checkpoint must give identical logits (checks tensor names, dims order and metadata mapping);
// the real SmolLM2 file loads with its configuration and vocabulary.
#include "model/gguf_loader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_runner.h"
#include "model/gguf_writer.h"
#include "model/loader.h"
#include "test_util.h"

namespace specinfer {
namespace {

struct RandomWeights {
  int dim = 32, hidden = 48, layers = 2, heads = 4, kv_heads = 2, vocab = 64, seq = 64;
  std::vector<float> emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final;
  explicit RandomWeights(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto fill = [&](std::vector<float>& v, size_t n, bool norm = false) {
      v.resize(n);
      for (float& x : v) x = norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
    };
    const int kv_dim = dim / heads * kv_heads;
    fill(emb, vocab * dim);
    fill(rms_att, layers * dim, true);
    fill(wq, layers * dim * dim);
    fill(wk, layers * kv_dim * dim);
    fill(wv, layers * kv_dim * dim);
    fill(wo, layers * dim * dim);
    fill(rms_ffn, layers * dim, true);
    fill(w1, layers * hidden * dim);
    fill(w2, layers * dim * hidden);
    fill(w3, layers * hidden * dim);
    fill(rms_final, dim, true);
  }
  int kv_dim() const { return dim / heads * kv_heads; }

  std::string Llama2c() const {
    std::string out;
    int32_t h[7] = {dim, hidden, layers, heads, kv_heads, vocab, seq};
    out.append(reinterpret_cast<const char*>(h), sizeof(h));
    for (const auto* v : {&emb, &rms_att, &wq, &wk, &wv, &wo, &rms_ffn, &w1, &w2, &w3,
                          &rms_final})
      out.append(reinterpret_cast<const char*>(v->data()), v->size() * 4);
    out.append(static_cast<size_t>(seq) * (dim / heads) * 4, '\0');  // legacy freq_cis
    return out;
  }

  std::string Gguf() const {
    GgufWriter g;
    g.KvString("general.architecture", "llama");
    g.KvU32("llama.block_count", layers);
    g.KvU32("llama.context_length", seq);
    g.KvU32("llama.embedding_length", dim);
    g.KvU32("llama.feed_forward_length", hidden);
    g.KvU32("llama.attention.head_count", heads);
    g.KvU32("llama.attention.head_count_kv", kv_heads);
    g.KvF32("llama.rope.freq_base", 10000.0f);
    g.KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    g.Tensor("token_embd.weight", {dim, vocab}, emb.data());
    g.Tensor("output_norm.weight", {dim}, rms_final.data());
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      g.Tensor(p + "attn_norm.weight", {dim}, &rms_att[l * dim]);
      g.Tensor(p + "attn_q.weight", {dim, dim}, &wq[l * dim * dim]);
      g.Tensor(p + "attn_k.weight", {dim, kv_dim()}, &wk[l * kv_dim() * dim]);
      g.Tensor(p + "attn_v.weight", {dim, kv_dim()}, &wv[l * kv_dim() * dim]);
      g.Tensor(p + "attn_output.weight", {dim, dim}, &wo[l * dim * dim]);
      g.Tensor(p + "ffn_norm.weight", {dim}, &rms_ffn[l * dim]);
      g.Tensor(p + "ffn_gate.weight", {dim, hidden}, &w1[l * hidden * dim]);
      g.Tensor(p + "ffn_down.weight", {hidden, dim}, &w2[l * dim * hidden]);
      g.Tensor(p + "ffn_up.weight", {dim, hidden}, &w3[l * hidden * dim]);
    }
    return g.Finish();
  }
};

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  // This process's own scratch folder: the isa_* ctest entries run this binary beside itself.
  static const std::filesystem::path dir = testing::ScratchDir("specinfer_gguf_loader_test");
  auto path = (dir / name).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

using testing::LastLogits;

TEST(GgufLoader, SameWeightsAsLlama2cGiveIdenticalLogits) {
  RandomWeights w(11);
  auto a = LoadModel(WriteTemp("m.bin", w.Llama2c()));
  auto b = LoadModel(WriteTemp("m.gguf", w.Gguf()));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const ModelConfig& ca = (*a)->config();
  const ModelConfig& cb = (*b)->config();
  EXPECT_EQ(ca.ToString(), cb.ToString());
  std::vector<int32_t> toks = {1, 5, 9, 33, 7, 2, 60};
  EXPECT_EQ(LastLogits(std::move(a).value(), toks), LastLogits(std::move(b).value(), toks));
}

TEST(GgufLoader, MissingTensorAndBadMetadataAreClearErrors) {
  RandomWeights w(3);
  std::string gguf = w.Gguf();
  // Rename a tensor so blk.1.ffn_up.weight is missing.
  size_t at = gguf.find("blk.1.ffn_up.weight");
  ASSERT_NE(at, std::string::npos);
  std::string renamed = gguf;
  renamed[at] = 'X';
  auto m = LoadModel(WriteTemp("missing.gguf", renamed));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("blk.1.ffn_up.weight"), std::string::npos)
      << m.status().ToString();

  std::string arch = gguf;
  size_t a = arch.find("llama");
  arch.replace(a, 5, "gpt-j");
  auto m2 = LoadModel(WriteTemp("arch.gguf", arch));
  ASSERT_FALSE(m2.ok());
  EXPECT_EQ(m2.status().code(), StatusCode::kUnimplemented);
}

std::string SmolLM2Path() { return testing::DefaultModel(); }

TEST(GgufLoader, LoadsSmolLM2WithItsVocabulary) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh)";
  auto loaded = LoadModelAndTokenizer(SmolLM2Path(), "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ModelConfig& c = loaded->model->config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_TRUE(c.tied_output);
  EXPECT_EQ(loaded->model->weights().layers[0].wq.type, DType::kQ4_1);
  EXPECT_EQ(loaded->model->weights().token_embedding.type, DType::kQ8_0);
  ASSERT_TRUE(loaded->tokenizer);
  EXPECT_EQ(loaded->tokenizer->vocab_size(), 49152);
  EXPECT_NE(loaded->chat_template.find("<|im_start|>"), std::string::npos);
  // Ids as Hugging Face tokenizers gives them for SmolLM2 (tests/data/tokenizer/smollm2).
  auto ids = loaded->tokenizer->Encode("The capital of France is", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{504, 3575, 282, 4649, 314}));
}

}  // namespace
}  // namespace specinfer
