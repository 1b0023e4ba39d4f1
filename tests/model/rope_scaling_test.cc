// RoPE scaling (context extension): RopeInvFrequencies against independent numpy values
// (tests/reference/make_rope_vectors.py: Hugging Face's linear and llama3 formulas), and a tiny
// random Llama with llama3 / linear scaling written as a Hugging Face directory (config.json
// rope_scaling) and as GGUF (llama.cpp's rope_freqs tensor / rope.scaling.* keys, Q/K permuted)
// giving the same logits at positions where the scaling matters, and different logits from the
// unscaled model. Invalid scaling parameters are clean errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <numbers>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/ops.h"
#include "model/gguf_writer.h"
#include "model/hf_loader.h"
#include "model/loader.h"
#include "model/model_config.h"
#include "test_util.h"

namespace specinfer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// RopeInvFrequencies against the numpy reference.

Json LoadReference() {
  std::ifstream in(testing::SourcePath("tests/data/rope/llama3_inv_freq.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

void ExpectRelClose(const std::vector<float>& got, const Json& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    EXPECT_LE(std::fabs(got[i] - w), rel * std::fabs(w)) << "i=" << i << ": " << got[i] << " vs " << w;
  }
}

ModelConfig BaseConfig(int32_t head_dim, float theta) {
  ModelConfig c;
  c.dim = head_dim * 4;
  c.hidden_dim = c.dim * 2;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.head_dim = head_dim;
  c.vocab_size = 16;
  c.max_seq_len = 1024;
  c.rope_theta = theta;
  return c;
}

TEST(RopeInvFrequencies, UnscaledIsTheHistoricalFloatFormulaBitForBit) {
  ModelConfig c = BaseConfig(48, 10000.0f);
  ASSERT_TRUE(c.Validate().ok());
  std::vector<float> inv = RopeInvFrequencies(c);
  ASSERT_EQ(inv.size(), 24u);
  for (int i = 0; i < 24; ++i) {
    const float want = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / 48.0f);
    EXPECT_EQ(std::memcmp(&inv[i], &want, 4), 0) << i;
  }
}

TEST(RopeInvFrequencies, Llama3MatchesHuggingFaceFormulaForLlama31_8B) {
  Json ref = LoadReference();
  ASSERT_FALSE(ref.is_discarded()) << "tests/data/rope/llama3_inv_freq.json";
  const Json& l3 = ref["llama3"];
  ModelConfig c = BaseConfig(l3["head_dim"].get<int32_t>(), l3["rope_theta"].get<float>());
  c.rope_scaling.type = RopeScalingType::kLlama3;
  c.rope_scaling.factor = l3["factor"].get<float>();
  c.rope_scaling.low_freq_factor = l3["low_freq_factor"].get<float>();
  c.rope_scaling.high_freq_factor = l3["high_freq_factor"].get<float>();
  c.rope_scaling.original_max_position_embeddings =
      l3["original_max_position_embeddings"].get<int32_t>();
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  std::vector<float> inv = RopeInvFrequencies(c);
  ExpectRelClose(inv, l3["inv_freq"], 1e-6);
  // Not vacuous: low frequencies are divided by 8, high ones untouched, some in between.
  ModelConfig plain = c;
  plain.rope_scaling = RopeScaling();
  std::vector<float> base = RopeInvFrequencies(plain);
  int kept = 0, divided = 0, smooth = 0;
  for (size_t i = 0; i < inv.size(); ++i) {
    const float r = base[i] / inv[i];
    if (std::fabs(r - 1.0f) < 1e-6f) ++kept;
    else if (std::fabs(r - 8.0f) < 1e-5f) ++divided;
    else ++smooth;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smooth, 0);

  // The same through llama.cpp's per-dimension frequency factors (rope_freqs.weight).
  ModelConfig gguf_like = plain;
  for (const Json& f : l3["llamacpp_rope_freqs"]) gguf_like.rope_freq_factors.push_back(f.get<float>());
  ASSERT_TRUE(gguf_like.Validate().ok());
  ExpectRelClose(RopeInvFrequencies(gguf_like), l3["inv_freq"], 1e-6);
}

TEST(RopeInvFrequencies, LinearMatchesHuggingFaceFormula) {
  Json ref = LoadReference();
  ASSERT_FALSE(ref.is_discarded());
  const Json& lin = ref["linear"];
  ModelConfig c = BaseConfig(lin["head_dim"].get<int32_t>(), lin["rope_theta"].get<float>());
  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = lin["factor"].get<float>();
  ASSERT_TRUE(c.Validate().ok());
  ExpectRelClose(RopeInvFrequencies(c), lin["inv_freq"], 1e-6);
}

TEST(RopeInvFrequencies, RopeTableUsesThem) {
  ModelConfig c = BaseConfig(8, 10000.0f);
  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = 4.0f;
  std::vector<float> inv = RopeInvFrequencies(c);
  for (int32_t max_pos : {64, 0}) {  // from the table, and computed on the fly
    cpu::RopeTable table(inv, max_pos);
    std::vector<float> v(8, 0.0f);
    for (int i = 0; i < 4; ++i) v[2 * i] = 1.0f;  // (1, 0) pairs
    table.Apply(v.data(), 1, 37, RopeStyle::kInterleaved);
    for (int i = 0; i < 4; ++i) {
      const float angle = 37.0f * inv[i];
      EXPECT_FLOAT_EQ(v[2 * i], std::cos(angle)) << i;
      EXPECT_FLOAT_EQ(v[2 * i + 1], std::sin(angle)) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tiny random Llama as HF directory and GGUF.

using testing::WriteFile;

// This file's scratch folder (created once, first) and fresh subfolders of it.
fs::path TestRoot() {
  static const fs::path root = testing::ScratchDir("rope_scaling");
  return root;
}
fs::path TestDir(const std::string& name) {
  TestRoot();
  return testing::ScratchDir("rope_scaling/" + name);
}

// F32 safetensors with a header padded to 8 bytes.
std::string SafetensorsBytes(
    const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& t) {
  Json h = Json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, sv] : t) {
    const size_t start = data.size();
    data.append(reinterpret_cast<const char*>(sv.second.data()), sv.second.size() * 4);
    h[name] = {{"dtype", "F32"}, {"shape", sv.first}, {"data_offsets", {start, data.size()}}};
  }
  std::string header = h.dump();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// convert_hf_to_gguf.py LlamaModel.permute (half-split rows -> interleaved rows, per head).
std::vector<float> PermuteForGguf(const std::vector<float>& w, int n_head, int rows, int cols) {
  const int half = rows / n_head / 2;
  std::vector<float> out(w.size());
  for (int h = 0; h < n_head; ++h)
    for (int s = 0; s < 2; ++s)
      for (int j = 0; j < half; ++j) {
        const int src = (h * 2 + s) * half + j;
        const int dst = (h * half + j) * 2 + s;
        std::memcpy(&out[static_cast<size_t>(dst) * cols], &w[static_cast<size_t>(src) * cols],
                    sizeof(float) * cols);
      }
  return out;
}

// convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: rope_freqs for rope_type llama3,
// computed as it does (float32 torch frequencies, Python-float thresholds).
std::vector<float> LlamaCppRopeFreqs(int head_dim, float base, float factor, float low,
                                     float high, int old_ctx) {
  const double low_freq_wavelen = old_ctx / static_cast<double>(low);
  const double high_freq_wavelen = old_ctx / static_cast<double>(high);
  std::vector<float> out;
  for (int i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(head_dim));
    const float wavelen = static_cast<float>(2 * std::numbers::pi) / freq;
    if (wavelen < high_freq_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth = static_cast<float>((old_ctx / static_cast<double>(wavelen) - low) /
                                              (high - low));
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

struct TinyLlama {
  // head_dim 16, so 8 frequencies: with theta 10000 and original context 16, frequency 0
  // (wavelength 6.3) is smoothed and the others (wavelength > 16) are divided by the factor.
  int dim = 32, hidden = 48, layers = 2, heads = 2, kv_heads = 1, vocab = 64, seq = 128;
  float theta = 10000.0f;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;

  explicit TinyLlama(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm = false) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(n);
      for (float& x : v) x = norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
      t[name] = {shape, v};
    };
    add("model.embed_tokens.weight", {vocab, dim});
    add("lm_head.weight", {vocab, dim});
    add("model.norm.weight", {dim}, true);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {dim}, true);
      add(p + "self_attn.q_proj.weight", {dim, dim});
      add(p + "self_attn.k_proj.weight", {kv_dim(), dim});
      add(p + "self_attn.v_proj.weight", {kv_dim(), dim});
      add(p + "self_attn.o_proj.weight", {dim, dim});
      add(p + "post_attention_layernorm.weight", {dim}, true);
      add(p + "mlp.gate_proj.weight", {hidden, dim});
      add(p + "mlp.up_proj.weight", {hidden, dim});
      add(p + "mlp.down_proj.weight", {dim, hidden});
    }
  }
  int kv_dim() const { return dim / heads * kv_heads; }
  int head_dim() const { return dim / heads; }

  void WriteHf(const fs::path& dir, const Json& rope_scaling) const {
    Json c = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", dim},
              {"intermediate_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kv_heads},
              {"vocab_size", vocab},
              {"max_position_embeddings", seq},
              {"rope_theta", theta},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"},
              {"rope_scaling", rope_scaling},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"}};
    WriteFile(dir / "config.json", c.dump(2));
    WriteFile(dir / "model.safetensors", SafetensorsBytes(t));
  }

  // `extra` adds keys / tensors (rope.scaling.*, rope_freqs.weight).
  std::string Gguf(const std::function<void(GgufWriter&)>& extra) const {
    GgufWriter g;
    g.KvString("general.architecture", "llama");
    g.KvU32("llama.block_count", layers);
    g.KvU32("llama.context_length", seq);
    g.KvU32("llama.embedding_length", dim);
    g.KvU32("llama.feed_forward_length", hidden);
    g.KvU32("llama.attention.head_count", heads);
    g.KvU32("llama.attention.head_count_kv", kv_heads);
    g.KvF32("llama.rope.freq_base", theta);
    g.KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (extra) extra(g);
    auto put = [&](const std::string& gname, const std::string& hname,
                   const std::vector<float>* values = nullptr) {
      const auto& [shape, v] = t.at(hname);
      std::vector<int64_t> dims(shape.rbegin(), shape.rend());
      g.Tensor(gname, dims, (values ? *values : v).data());
    };
    put("token_embd.weight", "model.embed_tokens.weight");
    put("output.weight", "lm_head.weight");
    put("output_norm.weight", "model.norm.weight");
    std::vector<std::vector<float>> keep;
    keep.reserve(2 * layers);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const std::string h = "model.layers." + std::to_string(l) + ".";
      put(p + "attn_norm.weight", h + "input_layernorm.weight");
      keep.push_back(PermuteForGguf(t.at(h + "self_attn.q_proj.weight").second, heads, dim, dim));
      put(p + "attn_q.weight", h + "self_attn.q_proj.weight", &keep.back());
      keep.push_back(
          PermuteForGguf(t.at(h + "self_attn.k_proj.weight").second, kv_heads, kv_dim(), dim));
      put(p + "attn_k.weight", h + "self_attn.k_proj.weight", &keep.back());
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

// Logits of every one of the last `rows` positions (rows x vocab, flattened).
std::vector<float> TailLogits(std::shared_ptr<Model> model, const std::vector<int32_t>& toks,
                              int rows) {
  CpuRunnerOptions o;
  o.num_threads = 1;
  o.num_kv_blocks = 8;
  auto runner = CpuModelRunner::Create(model, o);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return {};
  KvCacheManager kv(8, 16);
  SeqId s = kv.AddSequence();
  EXPECT_TRUE(kv.Reserve(s, static_cast<int32_t>(toks.size())).ok());
  ForwardBatch b;
  std::vector<int32_t> pos(toks.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  b.AddSequence(s, toks, pos, 0, nullptr);
  const int n = static_cast<int>(toks.size());
  for (int r = n - rows; r < n; ++r) b.logit_rows.push_back(r);
  const int32_t vocab = model->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  EXPECT_TRUE((*runner)->Forward(b, kv, logits).ok());
  return logits;
}

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> toks;
  for (int i = 0; i < n; ++i) toks.push_back((i * 37 + 11) % 64);
  return toks;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, float atol, float rtol) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), atol + rtol * std::fabs(b[i]))
        << "logit " << i << ": " << a[i] << " vs " << b[i];
}

StatusOr<std::shared_ptr<Model>> Load(const fs::path& path) {
  SI_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, LoadModel(path.string()));
  return std::shared_ptr<Model>(std::move(m));
}

constexpr int kPromptLen = 40, kRows = 8;  // logits at positions 32..39, beyond the 16 "trained"

const Json kLlama3 = {{"rope_type", "llama3"},
                      {"factor", 8.0},
                      {"low_freq_factor", 1.0},
                      {"high_freq_factor", 4.0},
                      {"original_max_position_embeddings", 16}};

TEST(RopeScalingModel, Llama3HfAndGgufGiveTheSameLogitsAndDifferFromUnscaled) {
  TinyLlama m(2024);
  const fs::path hf_dir = TestDir("llama3_hf"), plain_dir = TestDir("plain_hf");
  m.WriteHf(hf_dir, kLlama3);
  m.WriteHf(plain_dir, nullptr);
  const std::vector<float> ff = LlamaCppRopeFreqs(m.head_dim(), m.theta, 8.0f, 1.0f, 4.0f, 16);
  const fs::path gguf_path = TestRoot() / "llama3.gguf";
  WriteFile(gguf_path, m.Gguf([&](GgufWriter& g) {
    g.Tensor("rope_freqs.weight", {static_cast<int64_t>(ff.size())}, ff.data());
  }));

  auto hf = Load(hf_dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto gguf = Load(gguf_path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto plain = Load(plain_dir);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();

  const ModelConfig& ch = (*hf)->config();
  EXPECT_EQ(ch.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(ch.rope_scaling.factor, 8.0f);
  EXPECT_EQ(ch.rope_scaling.original_max_position_embeddings, 16);
  EXPECT_NE(ch.ToString().find("llama3"), std::string::npos) << ch.ToString();
  const ModelConfig& cg = (*gguf)->config();
  EXPECT_EQ(cg.rope_scaling.type, RopeScalingType::kNone);
  ASSERT_EQ(cg.rope_freq_factors.size(), 8u);
  // Both forms give the same frequencies; frequency 0 smoothed, the rest divided by 8.
  std::vector<float> fh = RopeInvFrequencies(ch), fg = RopeInvFrequencies(cg),
                     fp = RopeInvFrequencies((*plain)->config());
  for (size_t i = 0; i < fh.size(); ++i) {
    EXPECT_NEAR(fh[i], fg[i], 1e-6f * fh[i]) << i;
    EXPECT_LT(fh[i], fp[i]) << i;
  }

  const std::vector<int32_t> toks = Prompt(kPromptLen);
  std::vector<float> a = TailLogits(*hf, toks, kRows);
  std::vector<float> b = TailLogits(*gguf, toks, kRows);
  std::vector<float> p = TailLogits(*plain, toks, kRows);
  ExpectClose(a, b, 1e-5f, 1e-5f);
  const float changed = MaxAbsDiff(a, p);
  std::printf("llama3: max |scaled - unscaled| logit = %g, max |HF - GGUF| = %g\n", changed,
              MaxAbsDiff(a, b));
  EXPECT_GT(changed, 1e-2f) << "scaling did not change the logits: the test is vacuous";
}

TEST(RopeScalingModel, LinearHfAndGgufGiveTheSameLogitsAndDifferFromUnscaled) {
  TinyLlama m(77);
  const fs::path hf_dir = TestDir("linear_hf"), plain_dir = TestDir("linear_plain_hf");
  m.WriteHf(hf_dir, {{"type", "linear"}, {"factor", 4.0}});  // legacy key "type"
  m.WriteHf(plain_dir, {{"rope_type", "default"}});
  const fs::path gguf_path = TestRoot() / "linear.gguf";
  WriteFile(gguf_path, m.Gguf([&](GgufWriter& g) {
    g.KvString("llama.rope.scaling.type", "linear");
    g.KvF32("llama.rope.scaling.factor", 4.0f);
  }));
  auto hf = Load(hf_dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto gguf = Load(gguf_path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto plain = Load(plain_dir);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*hf)->config().rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ((*gguf)->config().rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ((*gguf)->config().rope_scaling.factor, 4.0f);
  EXPECT_EQ((*plain)->config().rope_scaling.type, RopeScalingType::kNone);

  const std::vector<int32_t> toks = Prompt(kPromptLen);
  std::vector<float> a = TailLogits(*hf, toks, kRows);
  std::vector<float> b = TailLogits(*gguf, toks, kRows);
  std::vector<float> p = TailLogits(*plain, toks, kRows);
  ExpectClose(a, b, 1e-5f, 1e-5f);
  const float changed = MaxAbsDiff(a, p);
  std::printf("linear: max |scaled - unscaled| logit = %g, max |HF - GGUF| = %g\n", changed,
              MaxAbsDiff(a, b));
  EXPECT_GT(changed, 1e-2f);
}

// ---------------------------------------------------------------------------------------------
// Invalid parameters.

TEST(RopeScaling, ValidateRejectsImpossibleValues) {
  RopeScaling ok;
  EXPECT_TRUE(ok.Validate().ok());
  struct Case {
    RopeScaling s;
    std::string mention;
  };
  auto llama3 = [] {
    RopeScaling s;
    s.type = RopeScalingType::kLlama3;
    s.factor = 8.0f;
    return s;
  };
  std::vector<Case> cases;
  RopeScaling s = llama3();
  EXPECT_TRUE(s.Validate().ok());
  s.factor = 0.5f;
  cases.push_back({s, "factor"});
  s = llama3();
  s.factor = NAN;
  cases.push_back({s, "factor"});
  s = llama3();
  s.low_freq_factor = 0.0f;
  cases.push_back({s, "low_freq_factor"});
  s = llama3();
  s.high_freq_factor = -1.0f;
  cases.push_back({s, "high_freq_factor"});
  s = llama3();
  s.low_freq_factor = 4.0f;
  s.high_freq_factor = 4.0f;
  cases.push_back({s, "low_freq_factor"});
  s = llama3();
  s.original_max_position_embeddings = 0;
  cases.push_back({s, "original_max_position_embeddings"});
  s = RopeScaling();
  s.type = RopeScalingType::kLinear;
  s.factor = 0.0f;
  cases.push_back({s, "factor"});
  for (const Case& c : cases) {
    Status st = c.s.Validate();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << c.s.ToString();
    EXPECT_NE(st.message().find(c.mention), std::string::npos) << st.ToString();
    ModelConfig mc = BaseConfig(16, 10000.0f);
    mc.rope_scaling = c.s;
    EXPECT_FALSE(mc.Validate().ok()) << c.s.ToString();
  }
  ModelConfig mc = BaseConfig(16, 10000.0f);
  mc.rope_freq_factors = {1, 2, 3};
  EXPECT_NE(mc.Validate().message().find("rope_freq_factors"), std::string::npos);
  mc.rope_freq_factors = {1, 1, 1, 1, 1, 1, 1, -1};
  EXPECT_NE(mc.Validate().message().find("rope_freq_factors[7]"), std::string::npos);
}

TEST(RopeScaling, BadHfRopeScalingIsACleanError) {
  TinyLlama m(5);
  Json base = {{"model_type", "llama"},       {"hidden_size", 32},
               {"intermediate_size", 48},     {"num_hidden_layers", 1},
               {"num_attention_heads", 2},    {"vocab_size", 64},
               {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5}};
  struct Case {
    std::string name;
    Json scaling;
    StatusCode code;
    std::string mention;
  };
  Json no_low = kLlama3;
  no_low.erase("low_freq_factor");
  Json str_factor = kLlama3;
  str_factor["factor"] = "8";
  Json small = kLlama3;
  small["factor"] = 0.5;
  Json inverted = kLlama3;
  inverted["low_freq_factor"] = 4.0;
  inverted["high_freq_factor"] = 1.0;
  Json zero_ctx = kLlama3;
  zero_ctx["original_max_position_embeddings"] = 0;
  const std::vector<Case> cases = {
      {"yarn", {{"rope_type", "yarn"}, {"factor", 4.0}}, StatusCode::kUnimplemented, "yarn"},
      {"dynamic", {{"type", "dynamic"}, {"factor", 2.0}}, StatusCode::kUnimplemented, "dynamic"},
      {"longrope", {{"rope_type", "longrope"}}, StatusCode::kUnimplemented, "longrope"},
      {"not an object", "llama3", StatusCode::kUnimplemented, "rope_scaling"},
      {"linear without factor", {{"rope_type", "linear"}}, StatusCode::kInvalidArgument, "factor"},
      {"llama3 without low_freq_factor", no_low, StatusCode::kInvalidArgument, "low_freq_factor"},
      {"string factor", str_factor, StatusCode::kInvalidArgument, "factor"},
      {"numeric rope_type", {{"rope_type", 3}}, StatusCode::kInvalidArgument, "rope_type"},
      {"factor below 1", small, StatusCode::kDataLoss, "factor"},
      {"low >= high", inverted, StatusCode::kDataLoss, "low_freq_factor"},
      {"zero original context", zero_ctx, StatusCode::kDataLoss,
       "original_max_position_embeddings"},
  };
  for (const Case& c : cases) {
    Json j = base;
    j["rope_scaling"] = c.scaling;
    auto r = ModelConfigFromHfJson(j.dump(), "dir/config.json");
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.mention), std::string::npos)
        << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos)
        << c.name << ": " << r.status().ToString();
  }
  Json j = base;
  j["rope_scaling"] = kLlama3;
  auto r = ModelConfigFromHfJson(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FLOAT_EQ(r->rope_scaling.high_freq_factor, 4.0f);
}

TEST(RopeScaling, BadGgufRopeScalingIsACleanError) {
  TinyLlama m(9);
  struct Case {
    std::string name;
    std::function<void(GgufWriter&)> extra;
    StatusCode code;
    std::string mention;
  };
  static const std::vector<float> short_ff = {1.0f, 2.0f, 3.0f};
  static const std::vector<float> negative_ff = {1, 1, 1, 1, 1, 1, 1, -2};
  const std::vector<Case> cases = {
      {"yarn",
       [](GgufWriter& g) {
         g.KvString("llama.rope.scaling.type", "yarn");
         g.KvF32("llama.rope.scaling.factor", 4.0f);
       },
       StatusCode::kUnimplemented, "yarn"},
      {"linear without factor", [](GgufWriter& g) { g.KvString("llama.rope.scaling.type", "linear"); },
       StatusCode::kInvalidArgument, "rope.scaling.factor"},
      {"linear factor below 1",
       [](GgufWriter& g) {
         g.KvString("llama.rope.scaling.type", "linear");
         g.KvF32("llama.rope.scaling.factor", 0.25f);
       },
       StatusCode::kDataLoss, "factor"},
      {"rope_freqs of the wrong size",
       [](GgufWriter& g) { g.Tensor("rope_freqs.weight", {3}, short_ff.data()); },
       StatusCode::kInvalidArgument, "rope_freqs"},
      {"negative rope_freqs",
       [](GgufWriter& g) { g.Tensor("rope_freqs.weight", {8}, negative_ff.data()); },
       StatusCode::kDataLoss, "rope_freq_factors"},
  };
  for (const Case& c : cases) {
    const fs::path path = TestRoot() / ("bad_" + std::to_string(&c - cases.data()) + ".gguf");
    WriteFile(path, m.Gguf(c.extra));
    auto r = Load(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.mention), std::string::npos)
        << c.name << ": " << r.status().ToString();
  }
}

}  // namespace
}  // namespace specinfer
