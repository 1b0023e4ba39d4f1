#include "model/gguf_loader.h"

#include <cmath>
#include <cstring>

#include "model/llama_weights.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/llama2c_tokenizer.h"

namespace specinfer {

namespace {

std::string Key(const std::string& arch, const char* suffix) { return arch + "." + suffix; }

// Gemma 2/3's embedding scale, attention scale, soft-caps and sliding-window layers, as llama.cpp
// sets them (several are not in the GGUF metadata: llama.cpp fixes them per architecture).
Status GemmaSettings(const GgufFile& g, const std::string& arch, ModelConfig& c) {
  c.embedding_scale = std::sqrt(static_cast<float>(c.dim));
  // query_pre_attn_scalar: head_dim, except the 27B models (62 layers in Gemma 3, 46 in Gemma 2)
  // which use dim / n_heads.
  const bool big = (arch == "gemma3" && c.n_layers == 62) || (arch == "gemma2" && c.n_layers == 46);
  if (big && c.n_heads > 0) c.attention_scale = 1.0f / std::sqrt(float(c.dim / c.n_heads));
  SI_ASSIGN_OR_RETURN(c.sliding_window, g.GetI32(Key(arch, "attention.sliding_window"), 0));
  // Sliding layers: llama.cpp's swa pattern (2 for Gemma 2, 6 for Gemma 3): layer i is local
  // when i % pattern < pattern - 1; a GGUF may override the pattern.
  int32_t pattern = arch == "gemma2" ? 2 : 6;
  if (const GgufValue* v = g.Find(Key(arch, "attention.sliding_window_pattern"));
      v != nullptr && v->is_integer()) {
    SI_ASSIGN_OR_RETURN(pattern, v->AsInt<int32_t>());
  }
  if (pattern <= 0) return DataLossError("GGUF '" + g.path() + "': sliding_window_pattern " +
                                         std::to_string(pattern));
  if (c.sliding_window > 0) {
    c.sliding_layers.resize(static_cast<size_t>(std::max(c.n_layers, 0)));
    for (int32_t i = 0; i < c.n_layers; ++i) c.sliding_layers[i] = i % pattern < pattern - 1;
  }
  if (arch == "gemma3") {
    // llama.cpp fixes Gemma 3's local base at 10000 (rope_freq_base_train_swa) unless the file
    // states one.
    SI_ASSIGN_OR_RETURN(c.rope_theta_local, g.GetF32(Key(arch, "rope.freq_base_swa"), 10000.0f));
  }
  if (arch == "gemma2") {
    SI_ASSIGN_OR_RETURN(c.attn_softcap, g.GetF32(Key(arch, "attn_logit_softcapping"), 0.0f));
    SI_ASSIGN_OR_RETURN(c.final_softcap, g.GetF32(Key(arch, "final_logit_softcapping"), 0.0f));
  }
  return Status::Ok();
}

StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g) {
  SI_ASSIGN_OR_RETURN(std::string_view arch_sv, g.GetString("general.architecture"));
  const std::string arch(arch_sv);
  ModelConfig c;
  c.architecture = arch;
  if (arch == "llama") {
    c.rope_style = RopeStyle::kInterleaved;  // the converter pre-permutes Q and K
  } else if (arch == "qwen2") {
    c.rope_style = RopeStyle::kHalf;
    c.attention_bias = true;
  } else if (arch == "qwen3") {
    c.rope_style = RopeStyle::kHalf;
    c.qk_norm = true;
  } else if (arch == "gemma2" || arch == "gemma3") {
    // As llama.cpp's llm_build_gemma2/3. The converter stores the norm gains as 1 + w, so every
    // RMSNorm here is the plain one.
    c.rope_style = RopeStyle::kHalf;
    c.ffn_activation = FfnActivation::kGeluTanh;
    c.post_norms = true;
    c.qk_norm = arch == "gemma3";
  } else {
    return UnimplementedError("GGUF '" + g.path() + "': architecture '" + arch +
                              "' is not supported (llama, qwen2, qwen3, gemma2, gemma3)");
  }
  SI_ASSIGN_OR_RETURN(c.n_layers, g.GetI32(Key(arch, "block_count")));
  SI_ASSIGN_OR_RETURN(c.dim, g.GetI32(Key(arch, "embedding_length")));
  SI_ASSIGN_OR_RETURN(c.hidden_dim, g.GetI32(Key(arch, "feed_forward_length")));
  SI_ASSIGN_OR_RETURN(c.n_heads, g.GetI32(Key(arch, "attention.head_count")));
  SI_ASSIGN_OR_RETURN(c.n_kv_heads, g.GetI32(Key(arch, "attention.head_count_kv"), c.n_heads));
  SI_ASSIGN_OR_RETURN(c.max_seq_len, g.GetI32(Key(arch, "context_length")));
  SI_ASSIGN_OR_RETURN(c.rope_theta, g.GetF32(Key(arch, "rope.freq_base"), 10000.0f));
  SI_ASSIGN_OR_RETURN(c.norm_eps, g.GetF32(Key(arch, "attention.layer_norm_rms_epsilon"), 1e-5f));
  const int32_t default_head = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  SI_ASSIGN_OR_RETURN(c.head_dim, g.GetI32(Key(arch, "attention.key_length"), default_head));
  SI_ASSIGN_OR_RETURN(int32_t rope_dims, g.GetI32(Key(arch, "rope.dimension_count"), c.head_dim));
  if (rope_dims != c.head_dim)
    return UnimplementedError("GGUF '" + g.path() + "': partial rotary embedding (" +
                              std::to_string(rope_dims) + " of " + std::to_string(c.head_dim) +
                              " dims) is not supported");
  // RoPE scaling, as llama.cpp reads it: `rope.scaling.factor` (or the older `rope.scale_linear`)
  // gives freq_scale = 1 / factor, applied to every frequency (linear interpolation); Llama 3's
  // scheme is stored by convert_hf_to_gguf.py as a `rope_freqs.weight` tensor of head_dim / 2
  // divisors ("freq_factors" of ggml_rope_ext). yarn/longrope are not supported.
  SI_ASSIGN_OR_RETURN(std::string_view scaling, g.GetString(Key(arch, "rope.scaling.type"), "none"));
  if (scaling != "none" && scaling != "linear")
    return UnimplementedError("GGUF '" + g.path() + "': RoPE scaling type '" +
                              std::string(scaling) + "' is not supported (none, linear)");
  float factor = 0.0f;  // 0: not given (llama.cpp's convention too)
  if (g.Find(Key(arch, "rope.scaling.factor")) != nullptr) {
    SI_ASSIGN_OR_RETURN(factor, g.GetF32(Key(arch, "rope.scaling.factor")));
  } else if (g.Find(Key(arch, "rope.scale_linear")) != nullptr) {
    SI_ASSIGN_OR_RETURN(factor, g.GetF32(Key(arch, "rope.scale_linear")));
  }
  if (scaling == "linear" && factor == 0.0f)
    return InvalidArgumentError("GGUF '" + g.path() + "': RoPE scaling type 'linear' without " +
                                Key(arch, "rope.scaling.factor"));
  if (factor != 0.0f && factor != 1.0f) {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = factor;
  }
  if (g.FindTensor("rope_freqs.weight") != nullptr) {
    const int64_t half = c.head_dim > 0 ? c.head_dim / 2 : 0;
    SI_ASSIGN_OR_RETURN(WeightVector ff, g.GetF32Vector("rope_freqs.weight", half));
    c.rope_freq_factors.resize(static_cast<size_t>(half));
    if (half > 0) std::memcpy(c.rope_freq_factors.data(), ff.data, sizeof(float) * half);
  }
  if (const GgufValue* v = g.Find(Key(arch, "vocab_size"))) {
    SI_ASSIGN_OR_RETURN(c.vocab_size, v->AsInt<int32_t>());
  } else {
    SI_ASSIGN_OR_RETURN(const GgufTensor* emb, g.GetTensor("token_embd.weight"));
    c.vocab_size = static_cast<int32_t>(emb->dims[1]);
  }
  c.tied_output = g.FindTensor("output.weight") == nullptr;
  if (g.Find("specinfer.draft_token_ids") != nullptr) {
    SI_ASSIGN_OR_RETURN(c.draft_token_ids, g.GetI32Array("specinfer.draft_token_ids"));
    if (static_cast<int32_t>(c.draft_token_ids.size()) != c.vocab_size)
      return DataLossError("GGUF '" + g.path() + "': specinfer.draft_token_ids has " +
                           std::to_string(c.draft_token_ids.size()) + " entries for " +
                           std::to_string(c.vocab_size) + " vocabulary rows");
  }
  if (g.Find("specinfer.vocab_fingerprint") != nullptr) {
    SI_ASSIGN_OR_RETURN(const uint64_t fp, g.GetU64("specinfer.vocab_fingerprint"));
    c.vocab_fingerprint = fp;
  }
  if (arch == "gemma2" || arch == "gemma3") {
    SI_RETURN_IF_ERROR(GemmaSettings(g, arch, c));
  }
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext("GGUF '" + g.path() + "'");
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> ModelFromGguf(GgufFile& g) {
  SI_ASSIGN_OR_RETURN(ModelConfig c, ConfigFromGguf(g));
  // Names in LlamaTensorNames order: embedding, final norm, output, layer prefix; attention
  // (norm, q, k, v, o, q/k/v biases); feed-forward (norm, gate, up, down).
  constexpr LlamaTensorNames kNames{
      "token_embd.weight", "output_norm.weight", "output.weight", "blk.",
      "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
      "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
      "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
      "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
      "post_ffw_norm.weight"};
  const LlamaTensorReaders read{
      .matrix = [&g](const std::string& name, int64_t rows,
                     int64_t cols) { return g.GetWeightMatrix(name, rows, cols); },
      .vector = [&g](const std::string& name, int64_t size) { return g.GetF32Vector(name, size); }};
  SI_ASSIGN_OR_RETURN(ModelWeights w, ReadLlamaWeights(c, kNames, read));
  auto model = std::make_unique<Model>(c, std::move(w), g.path());
  std::unique_ptr<MappedFile> file = g.ReleaseMappedFile();
  if (file == nullptr) return InternalError("GGUF '" + g.path() + "' has no mapping to keep");
  model->AdoptFile(std::move(file));
  return model;
}

StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& g, int32_t vocab_size) {
  const std::string where = "GGUF '" + g.path() + "'";
  SI_ASSIGN_OR_RETURN(std::string_view kind, g.GetString("tokenizer.ggml.model"));
  SI_ASSIGN_OR_RETURN(std::span<const std::string_view> tokens,
                      g.GetStringArray("tokenizer.ggml.tokens"));
  if (static_cast<int64_t>(tokens.size()) != vocab_size) {
    return DataLossError(where + ": the vocabulary has " + std::to_string(tokens.size()) +
                         " tokens but the model's output has " + std::to_string(vocab_size));
  }
  std::vector<int32_t> types;
  if (g.Has("tokenizer.ggml.token_type")) {
    SI_ASSIGN_OR_RETURN(types, g.GetI32Array("tokenizer.ggml.token_type"));
  }
  SI_ASSIGN_OR_RETURN(int32_t bos, g.GetI32("tokenizer.ggml.bos_token_id", -1));
  SI_ASSIGN_OR_RETURN(int32_t eos, g.GetI32("tokenizer.ggml.eos_token_id", -1));
  std::optional<bool> add_bos;
  if (g.Has("tokenizer.ggml.add_bos_token")) {
    SI_ASSIGN_OR_RETURN(bool b, g.GetBool("tokenizer.ggml.add_bos_token"));
    add_bos = b;
  }

  if (kind == "gpt2") {
    SI_ASSIGN_OR_RETURN(std::span<const std::string_view> merges,
                        g.GetStringArray("tokenizer.ggml.merges"));
    SI_ASSIGN_OR_RETURN(std::string_view pre, g.GetString("tokenizer.ggml.pre", "default"));
    auto tok = BpeTokenizer::FromGgufVocab(tokens, merges, types, bos, eos, add_bos, pre);
    if (!tok.ok()) return tok.status().WithContext(where);
    return std::unique_ptr<Tokenizer>(std::move(tok).value());
  }
  if (kind == "llama") {
    SI_ASSIGN_OR_RETURN(std::vector<float> scores, g.GetF32Array("tokenizer.ggml.scores"));
    std::vector<std::string> pieces;
    pieces.reserve(tokens.size());
    for (std::string_view t : tokens) {
      // SentencePiece writes the space as U+2581 (E2 96 81).
      std::string s;
      for (size_t i = 0; i < t.size(); ++i) {
        if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
          s += ' ';
          i += 2;
        } else {
          s += t[i];
        }
      }
      pieces.push_back(std::move(s));
    }
    Llama2cTokenizer::SpecialIds ids;
    SI_ASSIGN_OR_RETURN(ids.unk_id, g.GetI32("tokenizer.ggml.unknown_token_id", 0));
    ids.bos_id = bos;
    ids.eos_id = eos;
    if (g.Has("tokenizer.ggml.add_space_prefix")) {
      SI_ASSIGN_OR_RETURN(ids.add_space_prefix, g.GetBool("tokenizer.ggml.add_space_prefix"));
    }
    std::vector<Llama2cTokenizer::TokenType> ttypes;
    for (int32_t t : types) {
      if (t < 1 || t > 6) return DataLossError(where + ": token type " + std::to_string(t));
      ttypes.push_back(static_cast<Llama2cTokenizer::TokenType>(t));
    }
    auto tok = Llama2cTokenizer::FromVocab(std::move(pieces), std::move(scores), ids,
                                           std::move(ttypes));
    if (!tok.ok()) return tok.status().WithContext(where);
    return std::unique_ptr<Tokenizer>(std::move(tok).value());
  }
  return UnimplementedError(where + ": tokenizer model '" + std::string(kind) +
                            "' is not supported (gpt2, llama)");
}

}  // namespace specinfer
