// Hugging Face model directories: a tiny random model written by the test as config.json +
// safetensors and as GGUF (Q/K permuted the way llama.cpp's convert_hf_to_gguf.py does) must give
// the same logits through either loader, which proves the half-split RoPE of HF checkpoints
// (kHalf) and the interleaved RoPE of GGUF llama (kInterleaved) are handled consistently. Also:
// F16/BF16 checkpoints, tied and untied heads, sharded checkpoints, and corrupt files and configs
// (clean errors, never a crash).
#include "model/hf_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_runner.h"
#include "model/gguf_writer.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "tensor/half.h"
#include "test_util.h"

namespace specinfer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Writers.

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string RawSafetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// Header JSON padded with spaces so the data starts 8-byte aligned (as the Python writer does).
std::string SafetensorsBytes(const std::vector<StTensor>& tensors, bool with_metadata = true) {
  Json h = Json::object();
  if (with_metadata) h["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  std::string data;
  for (const StTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    data += t.bytes;
  }
  std::string header = h.dump();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return RawSafetensors(header, data);
}

std::string Encode(const std::vector<float>& v, const std::string& dtype) {
  std::string out;
  for (float x : v) {
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&x), 4);
    } else {
      uint16_t h = dtype == "F16" ? Fp32ToFp16(x) : Fp32ToBf16(x);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

// Rounds through a 16-bit type (so an F32 checkpoint can hold exactly the F16/BF16 values).
std::vector<float> RoundTrip(const std::vector<float>& v, const std::string& dtype) {
  std::vector<float> out(v);
  if (dtype == "F16")
    for (float& x : out) x = Fp16ToFp32(Fp32ToFp16(x));
  if (dtype == "BF16")
    for (float& x : out) x = Bf16ToFp32(Fp32ToBf16(x));
  return out;
}

using testing::WriteFile;

// This file's scratch folder (created once, first) and fresh subfolders of it.
fs::path TestRoot() {
  static const fs::path root = testing::ScratchDir("hf_loader");
  return root;
}
fs::path TestDir(const std::string& name) {
  TestRoot();
  return testing::ScratchDir("hf_loader/" + name);
}

// convert_hf_to_gguf.py's LlamaModel.permute: rows of each head go from HF's half-split order
// to the interleaved order GGUF llama expects:
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
// (with n_head = n_head_kv for K).
std::vector<float> PermuteForGguf(const std::vector<float>& w, int n_head, int rows, int cols) {
  const int half = rows / n_head / 2;
  std::vector<float> out(w.size());
  for (int h = 0; h < n_head; ++h)
    for (int s = 0; s < 2; ++s)
      for (int j = 0; j < half; ++j) {
        const int src = (h * 2 + s) * half + j;  // [h][s][j]
        const int dst = (h * half + j) * 2 + s;  // [h][j][s]
        std::memcpy(&out[static_cast<size_t>(dst) * cols], &w[static_cast<size_t>(src) * cols],
                    sizeof(float) * cols);
      }
  return out;
}

// ---------------------------------------------------------------------------------------------
// A random Llama (or Qwen2) model in Hugging Face layout.

struct HfOptions {
  std::string dtype = "F32";
  std::string round_to;  // "F16"/"BF16": F32 values rounded to that type
  bool tied = false;
  bool write_lm_head = true;  // only consulted when tied (an untied model always has it)
  int shards = 1;             // > 1: model.safetensors.index.json and that many shards
  bool qwen2 = false;
};

struct RandomHfModel {
  int dim = 32, hidden = 48, layers = 2, heads = 4, kv_heads = 2, vocab = 64, seq = 64;
  // name -> (shape, values), in HF layout: [out_features, in_features].
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;

  RandomHfModel(uint32_t seed, bool qwen2, int vocab_size = 64) : vocab(vocab_size) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm = false) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(n);
      for (float& x : v) x = norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
      t[name] = {shape, v};
    };
    const int kv = kv_dim();
    add("model.embed_tokens.weight", {vocab, dim});
    add("lm_head.weight", {vocab, dim});
    add("model.norm.weight", {dim}, true);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {dim}, true);
      add(p + "self_attn.q_proj.weight", {dim, dim});
      add(p + "self_attn.k_proj.weight", {kv, dim});
      add(p + "self_attn.v_proj.weight", {kv, dim});
      add(p + "self_attn.o_proj.weight", {dim, dim});
      if (qwen2) {
        add(p + "self_attn.q_proj.bias", {dim});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
      add(p + "post_attention_layernorm.weight", {dim}, true);
      add(p + "mlp.gate_proj.weight", {hidden, dim});
      add(p + "mlp.up_proj.weight", {hidden, dim});
      add(p + "mlp.down_proj.weight", {dim, hidden});
    }
  }
  int kv_dim() const { return dim / heads * kv_heads; }

  Json Config(const HfOptions& o) const {
    return {{"architectures", {o.qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", o.qwen2 ? "qwen2" : "llama"},
            {"hidden_size", dim},
            {"intermediate_size", hidden},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"vocab_size", vocab},
            {"max_position_embeddings", seq},
            {"rope_theta", 10000.0},
            {"rms_norm_eps", 1e-5},
            {"hidden_act", "silu"},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", o.tied},
            {"torch_dtype", "float32"}};
  }

  // Writes config.json and the weights into `dir`.
  void WriteHf(const fs::path& dir, const HfOptions& o) const {
    WriteFile(dir / "config.json", Config(o).dump(2));
    std::vector<StTensor> all;
    for (const auto& [name, sv] : t) {
      if (name == "lm_head.weight" && o.tied && !o.write_lm_head) continue;
      std::vector<float> v = o.round_to.empty() ? sv.second : RoundTrip(sv.second, o.round_to);
      all.push_back({name, o.dtype, sv.first, Encode(v, o.dtype)});
    }
    if (o.shards <= 1) {
      WriteFile(dir / "model.safetensors", SafetensorsBytes(all));
      return;
    }
    Json map = Json::object();
    std::vector<std::vector<StTensor>> parts(o.shards);
    for (size_t i = 0; i < all.size(); ++i) {
      const int s = static_cast<int>(i % o.shards);
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, o.shards);
      map[all[i].name] = file;
      parts[s].push_back(all[i]);
    }
    for (int s = 0; s < o.shards; ++s) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, o.shards);
      WriteFile(dir / file, SafetensorsBytes(parts[s]));
    }
    WriteFile(dir / "model.safetensors.index.json",
              Json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2));
  }

  // The same model as GGUF: llama with Q/K permuted as convert_hf_to_gguf.py does, or qwen2
  // (no permutation: llama.cpp runs qwen2 with NEOX-style RoPE).
  std::string Gguf(bool qwen2, bool tied) const {
    const std::string arch = qwen2 ? "qwen2" : "llama";
    GgufWriter g;
    g.KvString("general.architecture", arch);
    g.KvU32(arch + ".block_count", layers);
    g.KvU32(arch + ".context_length", seq);
    g.KvU32(arch + ".embedding_length", dim);
    g.KvU32(arch + ".feed_forward_length", hidden);
    g.KvU32(arch + ".attention.head_count", heads);
    g.KvU32(arch + ".attention.head_count_kv", kv_heads);
    g.KvF32(arch + ".rope.freq_base", 10000.0f);
    g.KvF32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
    // ggml dims are the reverse of the PyTorch shape.
    auto put = [&](const std::string& gname, const std::string& hname,
                   const std::vector<float>* values = nullptr) {
      const auto& [shape, v] = t.at(hname);
      std::vector<int64_t> dims(shape.rbegin(), shape.rend());
      g.Tensor(gname, dims, (values ? *values : v).data());
    };
    put("token_embd.weight", "model.embed_tokens.weight");
    if (!tied) put("output.weight", "lm_head.weight");
    put("output_norm.weight", "model.norm.weight");
    std::vector<std::vector<float>> keep;  // permuted copies must outlive Tensor()
    keep.reserve(2 * layers);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const std::string h = "model.layers." + std::to_string(l) + ".";
      put(p + "attn_norm.weight", h + "input_layernorm.weight");
      if (qwen2) {
        put(p + "attn_q.weight", h + "self_attn.q_proj.weight");
        put(p + "attn_k.weight", h + "self_attn.k_proj.weight");
        put(p + "attn_q.bias", h + "self_attn.q_proj.bias");
        put(p + "attn_k.bias", h + "self_attn.k_proj.bias");
        put(p + "attn_v.bias", h + "self_attn.v_proj.bias");
      } else {
        keep.push_back(PermuteForGguf(t.at(h + "self_attn.q_proj.weight").second, heads, dim, dim));
        put(p + "attn_q.weight", h + "self_attn.q_proj.weight", &keep.back());
        keep.push_back(
            PermuteForGguf(t.at(h + "self_attn.k_proj.weight").second, kv_heads, kv_dim(), dim));
        put(p + "attn_k.weight", h + "self_attn.k_proj.weight", &keep.back());
      }
      put(p + "attn_v.weight", h + "self_attn.v_proj.weight");
      put(p + "attn_output.weight", h + "self_attn.o_proj.weight");
      put(p + "ffn_norm.weight", h + "post_attention_layernorm.weight");
      put(p + "ffn_gate.weight", h + "mlp.gate_proj.weight");
      put(p + "ffn_up.weight", h + "mlp.up_proj.weight");
      put(p + "ffn_down.weight", h + "mlp.down_proj.weight");
    }
    return g.Finish();
  }
};

using testing::LastLogits;

const std::vector<int32_t> kTokens = {1, 5, 9, 33, 7, 2, 60, 17, 44, 3};

// |a - b| <= atol + rtol * |b| everywhere; reports the worst element.
void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, float atol, float rtol) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  float worst = 0.0f;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float excess = std::fabs(a[i] - b[i]) - (atol + rtol * std::fabs(b[i]));
    if (i == 0 || excess > worst) {
      worst = excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0f) << "logit " << at << ": " << a[at] << " vs " << b[at];
}

StatusOr<std::unique_ptr<Model>> LoadHf(const fs::path& dir) {
  return ModelFromHfDirectory(dir.string());
}

// ---------------------------------------------------------------------------------------------
// (a) HF and GGUF forms of the same model agree.

class HfVsGguf : public ::testing::TestWithParam<bool> {};  // param: tied

TEST_P(HfVsGguf, LlamaGivesTheSameLogitsAsTheGgufConversion) {
  const bool tied = GetParam();
  RandomHfModel m(11, false);
  HfOptions o;
  o.tied = tied;
  o.write_lm_head = false;
  fs::path dir = TestDir(tied ? "llama_tied" : "llama_untied");
  m.WriteHf(dir, o);
  WriteFile(dir.parent_path() / (dir.filename().string() + ".gguf"), m.Gguf(false, tied));

  auto hf = LoadHf(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto gguf = LoadModel((dir.parent_path() / (dir.filename().string() + ".gguf")).string());
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  const ModelConfig& ch = (*hf)->config();
  const ModelConfig& cg = (*gguf)->config();
  EXPECT_EQ(ch.ToString(), cg.ToString());
  EXPECT_EQ(ch.rope_style, RopeStyle::kHalf);
  EXPECT_EQ(cg.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(ch.tied_output, tied);
  EXPECT_EQ((*hf)->source(), dir.string());
  const ModelWeights& w = (*hf)->weights();
  EXPECT_EQ(w.output.data == w.token_embedding.data, tied);

  std::vector<float> a = LastLogits(std::move(hf).value(), kTokens);
  std::vector<float> b = LastLogits(std::move(gguf).value(), kTokens);
  ExpectClose(a, b, 1e-5f, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, HfVsGguf, ::testing::Bool());

TEST(HfLoader, WithoutThePermutationTheLogitsDiffer) {
  // Guards the test above: a GGUF written without convert_hf_to_gguf's permutation must not
  // agree, or the comparison proves nothing about RoPE.
  RandomHfModel m(12, false);
  fs::path dir = TestDir("llama_unpermuted");
  m.WriteHf(dir, {});
  RandomHfModel unpermuted = m;
  // Pre-apply the inverse permutation so that Gguf()'s permutation cancels out.
  for (int l = 0; l < m.layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    auto inverse = [](const std::vector<float>& w, int n_head, int rows, int cols) {
      // The permutation has finite order; apply it until the next step returns to w.
      std::vector<float> prev = w, cur = PermuteForGguf(w, n_head, rows, cols);
      while (cur != w) {
        prev = cur;
        cur = PermuteForGguf(cur, n_head, rows, cols);
      }
      return prev;
    };
    auto& q = unpermuted.t[h + "self_attn.q_proj.weight"].second;
    q = inverse(q, m.heads, m.dim, m.dim);
    auto& k = unpermuted.t[h + "self_attn.k_proj.weight"].second;
    k = inverse(k, m.kv_heads, m.kv_dim(), m.dim);
  }
  const fs::path gguf_path = dir.parent_path() / "llama_unpermuted.gguf";
  WriteFile(gguf_path, unpermuted.Gguf(false, false));
  auto hf = LoadHf(dir);
  auto gguf = LoadModel(gguf_path.string());
  ASSERT_TRUE(hf.ok() && gguf.ok());
  std::vector<float> a = LastLogits(std::move(hf).value(), kTokens);
  std::vector<float> b = LastLogits(std::move(gguf).value(), kTokens);
  float max_diff = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  EXPECT_GT(max_diff, 1e-3f);
}

TEST(HfLoader, Qwen2WithBiasesGivesTheSameLogitsAsGguf) {
  RandomHfModel m(13, true);
  HfOptions o;
  o.qwen2 = true;
  fs::path dir = TestDir("qwen2");
  m.WriteHf(dir, o);
  const fs::path gguf_path = dir.parent_path() / "qwen2.gguf";
  WriteFile(gguf_path, m.Gguf(true, false));
  auto hf = LoadHf(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto gguf = LoadModel(gguf_path.string());
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_TRUE((*hf)->config().attention_bias);
  EXPECT_EQ((*hf)->weights().layers[1].bk.size, m.kv_dim());
  std::vector<float> a = LastLogits(std::move(hf).value(), kTokens);
  std::vector<float> b = LastLogits(std::move(gguf).value(), kTokens);
  ExpectClose(a, b, 1e-5f, 1e-5f);
}

// ---------------------------------------------------------------------------------------------
// (b) 16-bit checkpoints: weights used in place, norms widened; same logits as an F32
// checkpoint holding the same (rounded) values.

class HfHalf : public ::testing::TestWithParam<const char*> {};

TEST_P(HfHalf, MatchesF32CheckpointWithTheSameValues) {
  const std::string dtype = GetParam();
  RandomHfModel m(21, false);
  HfOptions ref;
  ref.round_to = dtype;
  HfOptions half;
  half.dtype = dtype;
  fs::path ref_dir = TestDir("ref_" + dtype);
  fs::path half_dir = TestDir("half_" + dtype);
  m.WriteHf(ref_dir, ref);
  m.WriteHf(half_dir, half);
  auto a = LoadHf(ref_dir);
  auto b = LoadHf(half_dir);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const DType want = dtype == "F16" ? DType::kF16 : DType::kBF16;
  const ModelWeights& w = (*b)->weights();
  EXPECT_EQ(w.layers[0].wq.type, want);
  EXPECT_EQ(w.token_embedding.type, want);
  EXPECT_EQ(w.output.type, want);
  // Norm gains are converted to float32 exactly.
  const auto& norm = m.t.at("model.norm.weight").second;
  ASSERT_EQ(w.final_norm.size, m.dim);
  for (int i = 0; i < m.dim; ++i) EXPECT_EQ(w.final_norm.data[i], RoundTrip(norm, dtype)[i]) << i;
  ExpectClose(LastLogits(std::move(b).value(), kTokens), LastLogits(std::move(a).value(), kTokens),
              1e-4f, 1e-4f);
}

TEST_P(HfHalf, StaysCloseToTheUnroundedModel) {
  const std::string dtype = GetParam();
  RandomHfModel m(22, false);
  HfOptions half;
  half.dtype = dtype;
  fs::path ref_dir = TestDir("full_" + dtype);
  fs::path half_dir = TestDir("lossy_" + dtype);
  m.WriteHf(ref_dir, {});
  m.WriteHf(half_dir, half);
  auto a = LoadHf(ref_dir);
  auto b = LoadHf(half_dir);
  ASSERT_TRUE(a.ok() && b.ok());
  const float tol = dtype == "F16" ? 1e-2f : 8e-2f;
  ExpectClose(LastLogits(std::move(b).value(), kTokens), LastLogits(std::move(a).value(), kTokens),
              tol, tol);
}

INSTANTIATE_TEST_SUITE_P(Types, HfHalf, ::testing::Values("F16", "BF16"));

// ---------------------------------------------------------------------------------------------
// (c) Tied and untied heads.

TEST(HfLoader, TiedConfigUsesTheEmbeddingEvenWhenLmHeadIsStored) {
  RandomHfModel m(31, false);
  HfOptions o;
  o.tied = true;
  o.write_lm_head = true;
  fs::path dir = TestDir("tied_with_head");
  m.WriteHf(dir, o);
  auto model = LoadHf(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->config().tied_output);
  EXPECT_EQ((*model)->weights().output.data, (*model)->weights().token_embedding.data);
}

TEST(HfLoader, UntiedConfigWithoutLmHeadFallsBackToTheEmbedding) {
  RandomHfModel m(32, false);
  m.t.erase("lm_head.weight");
  fs::path dir = TestDir("untied_no_head");
  m.WriteHf(dir, {});
  auto model = LoadHf(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->config().tied_output);
  EXPECT_EQ((*model)->weights().output.data, (*model)->weights().token_embedding.data);
}

TEST(HfLoader, UntiedHeadChangesTheLogits) {
  RandomHfModel m(33, false);
  HfOptions tied, untied;
  tied.tied = true;
  fs::path d1 = TestDir("head_tied"), d2 = TestDir("head_untied");
  m.WriteHf(d1, tied);
  m.WriteHf(d2, untied);
  auto a = LoadHf(d1);
  auto b = LoadHf(d2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*b)->config().tied_output);
  EXPECT_NE((*b)->weights().output.data, (*b)->weights().token_embedding.data);
  EXPECT_NE(LastLogits(std::move(a).value(), kTokens), LastLogits(std::move(b).value(), kTokens));
}

// ---------------------------------------------------------------------------------------------
// (d) Sharded checkpoints.

TEST(HfLoader, ShardedCheckpointMatchesSingleFile) {
  RandomHfModel m(41, false);
  HfOptions single, sharded;
  sharded.shards = 3;
  fs::path d1 = TestDir("single"), d2 = TestDir("sharded");
  m.WriteHf(d1, single);
  m.WriteHf(d2, sharded);
  EXPECT_FALSE(fs::exists(d2 / "model.safetensors"));
  auto set = SafetensorsSet::OpenDirectory(d2.string());
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->num_files(), 3u);
  auto a = LoadHf(d1);
  auto b = LoadHf(d2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(LastLogits(std::move(a).value(), kTokens), LastLogits(std::move(b).value(), kTokens));
}

TEST(HfLoader, BadShardIndexIsACleanError) {
  RandomHfModel m(42, false);
  HfOptions sharded;
  sharded.shards = 2;
  fs::path dir = TestDir("bad_index");
  m.WriteHf(dir, sharded);
  const fs::path index = dir / "model.safetensors.index.json";
  auto with_index = [&](const std::string& text) {
    WriteFile(index, text);
    return LoadHf(dir).status();
  };
  Status s = with_index("{not json");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  s = with_index(R"({"weight_map": {"model.norm.weight": "../outside.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  s = with_index(R"({"weight_map": {"model.norm.weight": "missing.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  s = with_index(R"({"weight_map": {"no.such.tensor": "model-00001-of-00002.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("no.such.tensor"), std::string::npos) << s.ToString();
  s = with_index(R"({"weight_map": {"model.norm.weight": 7}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  // A shard list that leaves a needed tensor out: the model load names the missing tensor.
  s = with_index(R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})");
  EXPECT_FALSE(s.ok());
}

// ---------------------------------------------------------------------------------------------
// (e) Corrupt safetensors files.

Status OpenBytes(const std::string& name, const std::string& bytes) {
  fs::path p = TestRoot() / "corrupt" / name;
  WriteFile(p, bytes);
  return SafetensorsFile::Open(p.string()).status();
}

std::string Header(const Json& j) {
  std::string h = j.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  return h;
}

TEST(Safetensors, ReadsTensorsAndMetadata) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  fs::path p = TestDir("good") / "x.safetensors";
  WriteFile(p, SafetensorsBytes({{"a", "F32", {2, 3}, Encode(v, "F32")},
                                 {"b", "BF16", {3}, Encode({1, 2, 3}, "BF16")},
                                 {"c", "I64", {0}, ""}}));
  auto f = SafetensorsFile::Open(p.string());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const SafetensorsTensor* a = (*f)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*a->dtype, DType::kF32);
  EXPECT_EQ(a->num_elements(), 6);
  EXPECT_EQ(std::memcmp(a->data, v.data(), 24), 0);
  EXPECT_EQ(*(*f)->Find("b")->dtype, DType::kBF16);
  EXPECT_FALSE((*f)->Find("c")->dtype.has_value());
  auto missing = (*f)->Get("zzz");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("zzz"), std::string::npos);
}

TEST(Safetensors, CorruptFilesAreCleanErrors) {
  const std::string f32x4 = Encode({1, 2, 3, 4}, "F32");
  auto entry = [](const char* dtype, std::vector<int64_t> shape, size_t b, size_t e) {
    return Json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
  };
  struct Case {
    const char* name;
    std::string bytes;
    StatusCode code;
    const char* mention;  // text the message must contain
  };
  std::string huge(8, '\0');
  uint64_t big = 1ull << 40;
  std::memcpy(huge.data(), &big, 8);
  std::string past_eof(8, '\0');
  uint64_t n = 1000;
  std::memcpy(past_eof.data(), &n, 8);
  past_eof += "{}      ";
  const std::vector<Case> cases = {
      {"empty", std::string(), StatusCode::kDataLoss, ""},
      {"short", std::string(5, '\0'), StatusCode::kDataLoss, "truncated"},
      {"absurd_header", huge + "{}      ", StatusCode::kDataLoss, "absurd"},
      {"header_past_eof", past_eof, StatusCode::kDataLoss, "past the end"},
      {"malformed_json", RawSafetensors("{\"a\": [1, 2", f32x4), StatusCode::kDataLoss, "JSON"},
      {"not_object", RawSafetensors(Header(Json::array({1, 2})), f32x4), StatusCode::kDataLoss,
       "object"},
      {"offsets_past_end", RawSafetensors(Header({{"a", entry("F32", {8}, 0, 32)}}), f32x4),
       StatusCode::kDataLoss, "'a'"},
      {"shape_mismatch", RawSafetensors(Header({{"a", entry("F32", {3}, 0, 16)}}), f32x4),
       StatusCode::kDataLoss, "needs 12"},
      {"begin_after_end", RawSafetensors(Header({{"a", entry("F32", {0}, 16, 8)}}), f32x4),
       StatusCode::kDataLoss, "'a'"},
      {"negative_dim", RawSafetensors(Header({{"a", entry("F32", {-1}, 0, 4)}}), f32x4),
       StatusCode::kDataLoss, "shape"},
      {"overflowing_shape",
       RawSafetensors(Header({{"a", entry("F32", {1ll << 40, 1ll << 40}, 0, 16)}}), f32x4),
       StatusCode::kDataLoss, "overflows"},
      {"misaligned", RawSafetensors(Header({{"a", entry("F32", {1}, 2, 6)}}), f32x4),
       StatusCode::kDataLoss, "aligned"},
      {"overlap",
       RawSafetensors(Header({{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}),
                      f32x4),
       StatusCode::kDataLoss, "overlap"},
      {"unknown_dtype", RawSafetensors(Header({{"a", entry("Q4", {16}, 0, 8)}}), f32x4),
       StatusCode::kUnimplemented, "Q4"},
      {"no_dtype",
       RawSafetensors(Header({{"a", {{"shape", {4}}, {"data_offsets", {0, 16}}}}}), f32x4),
       StatusCode::kDataLoss, "dtype"},
      {"offsets_not_pair",
       RawSafetensors(Header({{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0}}}}}),
                      f32x4),
       StatusCode::kDataLoss, "data_offsets"},
      {"entry_not_object", RawSafetensors(Header({{"a", 5}}), f32x4), StatusCode::kDataLoss, "'a'"},
      {"bad_metadata", RawSafetensors(Header({{"__metadata__", {{"k", 1}}}}), f32x4),
       StatusCode::kDataLoss, "__metadata__"},
      {"duplicate",
       RawSafetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      f32x4),
       StatusCode::kInvalidArgument, "twice"},
  };
  for (const Case& c : cases) {
    Status s = OpenBytes(std::string(c.name) + ".safetensors", c.bytes);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.mention), std::string::npos) << c.name << ": " << s.ToString();
    if (!s.ok()) {
      EXPECT_NE(s.message().find(c.name), std::string::npos)
          << c.name << ": the message should name the file: " << s.ToString();
    }
  }
}

TEST(Safetensors, TruncatedFilesNeverCrash) {
  RandomHfModel m(51, false);
  fs::path dir = TestDir("truncate_src");
  m.WriteHf(dir, {});
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Every cut point in the header region and a spread of them through the data.
  for (size_t cut = 1; cut < bytes.size(); cut += cut < 4096 ? 7 : 997) {
    Status s = OpenBytes("cut.safetensors", bytes.substr(0, cut));
    EXPECT_FALSE(s.ok()) << "cut at " << cut;
  }
  // Flipping header bytes gives an error or a file that still validates, never a crash.
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::string b = bytes;
    b[8 + rng() % 512] ^= static_cast<char>(1 + rng() % 255);
    (void)OpenBytes("flip.safetensors", b);
  }
}

// ---------------------------------------------------------------------------------------------
// (e) Model-level errors: missing tensors, wrong shapes and types, bad config.json.

TEST(HfLoader, MissingOrMisshapenTensorsAreCleanErrors) {
  {
    RandomHfModel m(61, false);
    m.t.erase("model.layers.1.mlp.up_proj.weight");
    fs::path dir = TestDir("missing_tensor");
    m.WriteHf(dir, {});
    Status s = LoadHf(dir).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
  }
  {
    RandomHfModel m(62, false);
    m.t["model.layers.0.self_attn.k_proj.weight"].first = {m.dim, m.kv_dim()};
    fs::path dir = TestDir("misshapen");
    m.WriteHf(dir, {});
    Status s = LoadHf(dir).status();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("k_proj"), std::string::npos) << s.ToString();
  }
  {
    fs::path dir = TestDir("int_weights");
    RandomHfModel m(63, false);
    m.WriteHf(dir, {});
    std::vector<StTensor> all;
    for (const auto& [name, sv] : m.t) {
      std::string dtype = name == "model.norm.weight" ? "I32" : "F32";
      all.push_back({name, dtype, sv.first, Encode(sv.second, "F32")});
    }
    WriteFile(dir / "model.safetensors", SafetensorsBytes(all));
    Status s = LoadHf(dir).status();
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
    EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s.ToString();
  }
  {
    fs::path dir = TestDir("no_weights");
    RandomHfModel m(64, false);
    WriteFile(dir / "config.json", m.Config({}).dump());
    Status s = LoadHf(dir).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  }
  {
    fs::path dir = TestDir("no_config");
    Status s = LoadHf(dir).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("config.json"), std::string::npos) << s.ToString();
  }
}

TEST(HfLoader, BadConfigsAreCleanErrors) {
  RandomHfModel m(71, false);
  const Json good = m.Config({});
  ASSERT_TRUE(ModelConfigFromHfJson(good.dump(), "config.json").ok());
  struct Case {
    std::string name;
    std::function<void(Json&)> edit;
    StatusCode code;
    std::string mention;
  };
  const std::vector<Case> cases = {
      {"missing hidden_size", [](Json& j) { j.erase("hidden_size"); }, StatusCode::kInvalidArgument,
       "hidden_size"},
      {"missing vocab_size", [](Json& j) { j.erase("vocab_size"); }, StatusCode::kInvalidArgument,
       "vocab_size"},
      {"missing model_type", [](Json& j) { j.erase("model_type"); }, StatusCode::kInvalidArgument,
       "model_type"},
      {"string layers", [](Json& j) { j["num_hidden_layers"] = "2"; }, StatusCode::kInvalidArgument,
       "num_hidden_layers"},
      {"float heads", [](Json& j) { j["num_attention_heads"] = 4.5; }, StatusCode::kInvalidArgument,
       "num_attention_heads"},
      {"huge dim", [](Json& j) { j["hidden_size"] = 1ll << 40; }, StatusCode::kInvalidArgument,
       "hidden_size"},
      {"string eps", [](Json& j) { j["rms_norm_eps"] = "1e-5"; }, StatusCode::kInvalidArgument,
       "rms_norm_eps"},
      {"string tie", [](Json& j) { j["tie_word_embeddings"] = "yes"; },
       StatusCode::kInvalidArgument, "tie_word_embeddings"},
      {"model_type", [](Json& j) { j["model_type"] = "mixtral"; }, StatusCode::kUnimplemented,
       "mixtral"},
      {"rope_scaling",
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8}};
       },
       StatusCode::kUnimplemented, "rope_scaling"},
      {"rope_scaling string", [](Json& j) { j["rope_scaling"] = "linear"; },
       StatusCode::kUnimplemented, "rope_scaling"},
      {"activation", [](Json& j) { j["hidden_act"] = "gelu"; }, StatusCode::kUnimplemented, "gelu"},
      {"mlp bias", [](Json& j) { j["mlp_bias"] = true; }, StatusCode::kUnimplemented, "mlp_bias"},
      {"bad kv heads", [](Json& j) { j["num_key_value_heads"] = 3; }, StatusCode::kDataLoss,
       "n_kv_heads"},
      {"zero layers", [](Json& j) { j["num_hidden_layers"] = 0; }, StatusCode::kDataLoss,
       "n_layers"},
  };
  for (const Case& c : cases) {
    Json j = good;
    c.edit(j);
    auto r = ModelConfigFromHfJson(j.dump(), "dir/config.json");
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.mention), std::string::npos)
        << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos)
        << c.name << ": " << r.status().ToString();
  }
  for (const char* text : {"", "{", "[1,2]", "null", "\"llama\""}) {
    auto r = ModelConfigFromHfJson(text, "config.json");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
  }

  // Optional keys: defaults and null.
  Json j = good;
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j["head_dim"] = nullptr;
  j["rope_scaling"] = {{"rope_type", "default"}};
  auto r = ModelConfigFromHfJson(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n_kv_heads, r->n_heads);
  EXPECT_EQ(r->head_dim, m.dim / m.heads);
  EXPECT_FLOAT_EQ(r->rope_theta, 10000.0f);
  EXPECT_FALSE(r->tied_output);
  EXPECT_FALSE(r->attention_bias);
  j["attention_bias"] = true;
  r = ModelConfigFromHfJson(j.dump(), "config.json");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->attention_bias);
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  EXPECT_EQ(ModelConfigFromHfJson(j.dump(), "config.json").status().code(),
            StatusCode::kUnimplemented);
}

// ---------------------------------------------------------------------------------------------
// Through the generic loader: format detection and the tokenizer inside the directory.

TEST(HfLoader, LoaderDetectsDirectoriesAndLoadsTheTokenizer) {
  const std::string tok = testing::SourcePath("tests/data/tokenizer/smollm2/tokenizer.json");
  if (!fs::exists(tok)) GTEST_SKIP() << "tests/data/tokenizer/smollm2 absent";
  RandomHfModel m(81, false, /*vocab_size=*/49152);
  m.layers = 1;
  fs::path dir = TestDir("with_tokenizer");
  m.WriteHf(dir, {});
  auto format = DetectModelFormat(dir.string());
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  EXPECT_EQ(*format, ModelFormat::kHfDirectory);

  auto no_tok = LoadModelAndTokenizer(dir.string(), "");
  EXPECT_EQ(no_tok.status().code(), StatusCode::kNotFound) << no_tok.status().ToString();
  EXPECT_NE(no_tok.status().message().find("tokenizer.json"), std::string::npos);

  fs::copy_file(tok, dir / "tokenizer.json");
  WriteFile(dir / "tokenizer_config.json", Json{{"chat_template", "{{ messages }}"}}.dump());
  auto loaded = LoadModelAndTokenizer(dir.string(), "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->format, ModelFormat::kHfDirectory);
  EXPECT_EQ(loaded->model->config().vocab_size, 49152);
  EXPECT_EQ(loaded->model->config().n_layers, 1);
  ASSERT_TRUE(loaded->tokenizer);
  EXPECT_EQ(loaded->tokenizer->vocab_size(), 49152);
  EXPECT_EQ(loaded->chat_template, "{{ messages }}");

  // An explicit tokenizer path still wins.
  auto explicit_tok = LoadModelAndTokenizer(dir.string(), tok);
  ASSERT_TRUE(explicit_tok.ok()) << explicit_tok.status().ToString();

  fs::path empty = TestDir("plain_dir");
  EXPECT_FALSE(DetectModelFormat(empty.string()).ok());
}

}  // namespace
}  // namespace specinfer
