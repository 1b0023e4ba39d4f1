#include "model/hf_loader.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/llama_weights.h"
#include "model/safetensors.h"
#include "tensor/half.h"

namespace specinfer {

namespace {

using Json = nlohmann::json;

// Typed access to config.json's keys. A key holding null counts as absent (transformers writes
// e.g. "head_dim": null). Missing required keys and wrong types are InvalidArgument.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const Json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  StatusOr<int32_t> Int(const char* key, std::optional<int32_t> def = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr) return def ? StatusOr<int32_t>(*def) : Missing(key);
    if (!v->is_number_integer()) return WrongType(key, "an integer", *v);
    const int64_t x = v->is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
                          : v->get<int64_t>();
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
      return InvalidArgumentError(where_ + ": '" + key + "' = " + v->dump() + " is out of range");
    return static_cast<int32_t>(x);
  }

  StatusOr<float> Float(const char* key, std::optional<float> def = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr) return def ? StatusOr<float>(*def) : Missing(key);
    if (!v->is_number()) return WrongType(key, "a number", *v);
    return static_cast<float>(v->get<double>());
  }

  StatusOr<bool> Bool(const char* key, bool def) const {
    const Json* v = Find(key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
    return v->get<bool>();
  }

  StatusOr<std::string> String(const char* key,
                               std::optional<std::string> def = std::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr) return def ? StatusOr<std::string>(*def) : Missing(key);
    if (!v->is_string()) return WrongType(key, "a string", *v);
    return v->get<std::string>();
  }

  const std::string& where() const { return where_; }

 private:
  Status Missing(const char* key) const {
    return InvalidArgumentError(where_ + ": required key '" + std::string(key) + "' is missing");
  }
  Status WrongType(const char* key, const char* want, const Json& v) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 60) + "...";
    return InvalidArgumentError(where_ + ": '" + std::string(key) + "' must be " + want + ", not " +
                                shown);
  }

  const Json& j_;
  std::string where_;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Looks tensors up in a checkpoint and turns them into the model's weight views.
class WeightReader {
 public:
  WeightReader(const SafetensorsSet& set, Model& model) : set_(set), model_(model) {}

  // A [rows, cols] matrix used in place.
  StatusOr<WeightMatrix> Matrix(const std::string& name, int64_t rows, int64_t cols) const {
    SI_ASSIGN_OR_RETURN(const SafetensorsTensor* t, set_.Get(name));
    SI_RETURN_IF_ERROR(CheckType(*t));
    if (t->shape != std::vector<int64_t>{rows, cols}) return BadShape(*t, {rows, cols});
    WeightMatrix m;
    m.type = *t->dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = t->data;
    return m;
  }

  // A [size] vector as float32: in place when stored as F32, else widened into an owned buffer.
  StatusOr<WeightVector> Vector(const std::string& name, int64_t size) const {
    SI_ASSIGN_OR_RETURN(const SafetensorsTensor* t, set_.Get(name));
    SI_RETURN_IF_ERROR(CheckType(*t));
    if (t->shape != std::vector<int64_t>{size}) return BadShape(*t, {size});
    WeightVector v;
    v.size = size;
    if (*t->dtype == DType::kF32) {
      v.data = reinterpret_cast<const float*>(t->data);  // alignment checked by the reader
      return v;
    }
    float* out = model_.AllocateOwned(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      out[i] = *t->dtype == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
    v.data = out;
    return v;
  }

  // Gemma's norm gains: stored as w, applied as (1 + w): 1 + w in an owned float32 buffer.
  StatusOr<WeightVector> VectorPlusOne(const std::string& name, int64_t size) const {
    SI_ASSIGN_OR_RETURN(WeightVector v, Vector(name, size));
    float* out = model_.AllocateOwned(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) out[i] = 1.0f + v.data[i];
    v.data = out;
    return v;
  }

 private:
  Status CheckType(const SafetensorsTensor& t) const {
    if (!t.dtype.has_value()) {
      return UnimplementedError(set_.where() + ": tensor '" + t.name + "' has dtype " +
                                t.dtype_name + "; only F32, F16 and BF16 weights are supported");
    }
    return Status::Ok();
  }
  Status BadShape(const SafetensorsTensor& t, const std::vector<int64_t>& want) const {
    return DataLossError(set_.where() + ": tensor '" + t.name + "' has shape " +
                         ShapeString(t.shape) + ", expected " + ShapeString(want));
  }

  const SafetensorsSet& set_;
  Model& model_;
};

// config.json's "rope_scaling" (not null): {"rope_type" (or legacy "type"): "default" | "linear" |
// "llama3", ...}. Other schemes (yarn, dynamic, longrope...) are Unimplemented; missing or mistyped
// parameters of a supported scheme are InvalidArgument. Values are range-checked by Validate().
StatusOr<RopeScaling> ParseRopeScaling(const Json& s, const std::string& where) {
  auto shown = [&] {
    std::string t = s.dump();
    return t.size() > 120 ? t.substr(0, 120) + "..." : t;
  };
  if (!s.is_object()) {
    return UnimplementedError(where + ": rope_scaling " + shown() +
                              " is not supported (expected an object with rope_type)");
  }
  ConfigReader r(s, where + ": rope_scaling");
  std::string type;
  if (r.Find("rope_type") != nullptr) {
    SI_ASSIGN_OR_RETURN(type, r.String("rope_type"));
  } else {
    SI_ASSIGN_OR_RETURN(type, r.String("type", "default"));
  }
  RopeScaling out;
  if (type == "default") return out;
  if (type == "linear") {
    out.type = RopeScalingType::kLinear;
    SI_ASSIGN_OR_RETURN(out.factor, r.Float("factor"));
    return out;
  }
  if (type == "llama3") {
    out.type = RopeScalingType::kLlama3;
    SI_ASSIGN_OR_RETURN(out.factor, r.Float("factor"));
    SI_ASSIGN_OR_RETURN(out.low_freq_factor, r.Float("low_freq_factor"));
    SI_ASSIGN_OR_RETURN(out.high_freq_factor, r.Float("high_freq_factor"));
    SI_ASSIGN_OR_RETURN(out.original_max_position_embeddings,
                        r.Int("original_max_position_embeddings"));
    return out;
  }
  return UnimplementedError(where + ": rope_scaling " + shown() + ": rope_type '" + type +
                            "' is not supported (default, linear, llama3)");
}

bool IsGemma(const std::string& model_type) {
  return model_type == "gemma2" || model_type == "gemma3_text";
}

// RoPE base and scaling: transformers 4's "rope_theta" + "rope_scaling", or transformers 5's
// "rope_parameters" ({"rope_theta", "rope_type", ...}, or one such object per layer type for
// Gemma 3: "full_attention" and "sliding_attention").
Status ParseRope(const ConfigReader& r, const std::string& where, ModelConfig& c) {
  SI_ASSIGN_OR_RETURN(c.rope_theta, r.Float("rope_theta", 10000.0f));
  if (const Json* s = r.Find("rope_scaling")) {
    SI_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*s, where));
  }
  SI_ASSIGN_OR_RETURN(float local, r.Float("rope_local_base_freq", 0.0f));
  c.rope_theta_local = local;
  const Json* p = r.Find("rope_parameters");
  if (p == nullptr) return Status::Ok();
  if (!p->is_object()) return InvalidArgumentError(where + ": rope_parameters is not an object");
  const Json* full = p;
  if (p->contains("full_attention") || p->contains("sliding_attention")) {
    auto it = p->find("full_attention");
    if (it == p->end()) return InvalidArgumentError(where + ": rope_parameters without "
                                                    "full_attention");
    full = &*it;
    if (auto sl = p->find("sliding_attention"); sl != p->end()) {
      ConfigReader lr(*sl, where + ": rope_parameters.sliding_attention");
      SI_ASSIGN_OR_RETURN(std::string type, lr.String("rope_type", "default"));
      if (type != "default")
        return UnimplementedError(where + ": scaled RoPE on sliding layers is not supported");
      SI_ASSIGN_OR_RETURN(c.rope_theta_local, lr.Float("rope_theta"));
    }
  }
  ConfigReader fr(*full, where + ": rope_parameters");
  SI_ASSIGN_OR_RETURN(c.rope_theta, fr.Float("rope_theta", c.rope_theta));
  SI_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*full, where));
  return Status::Ok();
}

// Sliding-window layers: "layer_types" when given (transformers 5, Qwen, Gemma 3), else every
// layer (Mistral), every other one from the first (Gemma 2) or all but every
// sliding_window_pattern-th (Gemma 3, transformers 4). Needs c.n_layers.
Status ParseSlidingWindow(const ConfigReader& r, const std::string& model_type,
                          const std::string& where, ModelConfig& c) {
  if (model_type == "qwen2" || model_type == "qwen3") {
    SI_ASSIGN_OR_RETURN(bool sliding, r.Bool("use_sliding_window", false));
    if (sliding) return UnimplementedError(where + ": sliding-window attention is not supported");
    return Status::Ok();
  }
  if (model_type == "llama") return Status::Ok();
  SI_ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window", 0));
  if (c.sliding_window <= 0) {
    c.sliding_window = 0;
    return Status::Ok();
  }
  c.sliding_layers.assign(static_cast<size_t>(std::max(c.n_layers, 0)), 1);
  if (const Json* types = r.Find("layer_types")) {
    if (!types->is_array() || types->size() != c.sliding_layers.size())
      return InvalidArgumentError(where + ": layer_types must list every layer");
    for (size_t i = 0; i < types->size(); ++i) {
      const Json& t = (*types)[i];
      if (!t.is_string()) return InvalidArgumentError(where + ": layer_types holds a non-string");
      const std::string name = t.get<std::string>();
      if (name != "sliding_attention" && name != "full_attention")
        return UnimplementedError(where + ": layer type '" + name + "' is not supported");
      c.sliding_layers[i] = name == "sliding_attention";
    }
  } else if (model_type == "gemma2") {
    for (int32_t i = 0; i < c.n_layers; ++i) c.sliding_layers[i] = i % 2 == 0;
  } else if (model_type == "gemma3_text") {
    SI_ASSIGN_OR_RETURN(int32_t pattern, r.Int("sliding_window_pattern", 6));
    if (pattern <= 0) return InvalidArgumentError(where + ": sliding_window_pattern <= 0");
    for (int32_t i = 0; i < c.n_layers; ++i) c.sliding_layers[i] = (i + 1) % pattern != 0;
  }
  return Status::Ok();
}

StatusOr<ModelConfig> ParseConfig(const Json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  ConfigReader r(j, where);
  ModelConfig c;
  SI_ASSIGN_OR_RETURN(std::string model_type, r.String("model_type"));
  if (model_type != "llama" && model_type != "qwen2" && model_type != "qwen3" &&
      model_type != "mistral" && !IsGemma(model_type)) {
    return UnimplementedError(where + ": model_type '" + model_type +
                              "' is not supported (llama, mistral, qwen2, qwen3, gemma2, "
                              "gemma3_text)");
  }
  const bool gemma = IsGemma(model_type);
  c.architecture = model_type;
  c.rope_style = RopeStyle::kHalf;  // Hugging Face rotates half-split pairs; no permutation
  SI_ASSIGN_OR_RETURN(c.dim, r.Int("hidden_size"));
  SI_ASSIGN_OR_RETURN(c.hidden_dim, r.Int("intermediate_size"));
  SI_ASSIGN_OR_RETURN(c.n_layers, r.Int("num_hidden_layers"));
  SI_ASSIGN_OR_RETURN(c.n_heads, r.Int("num_attention_heads"));
  SI_ASSIGN_OR_RETURN(c.n_kv_heads, r.Int("num_key_value_heads", c.n_heads));
  const int32_t default_head = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  SI_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", default_head));
  SI_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  SI_ASSIGN_OR_RETURN(c.max_seq_len, r.Int("max_position_embeddings"));
  SI_ASSIGN_OR_RETURN(c.norm_eps, r.Float("rms_norm_eps"));
  // transformers' LlamaConfig and Qwen2Config default to untied embeddings, Gemma to tied.
  SI_ASSIGN_OR_RETURN(bool tied, r.Bool("tie_word_embeddings", gemma));
  c.tied_output = tied;
  if (model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases
  } else {
    SI_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
    SI_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
    if (mlp_bias) return UnimplementedError(where + ": mlp_bias is not supported");
  }
  c.qk_norm = model_type == "qwen3" || model_type == "gemma3_text";
  SI_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", gemma ? "gelu_pytorch_tanh"
                                                                    : "silu"));
  if (gemma) {
    SI_ASSIGN_OR_RETURN(act, r.String("hidden_activation", act));
  }
  if (act == "gelu_pytorch_tanh") {
    c.ffn_activation = FfnActivation::kGeluTanh;
  } else if (act != "silu") {
    return UnimplementedError(where + ": hidden_act '" + act +
                              "' is not supported (silu, gelu_pytorch_tanh)");
  }
  SI_ASSIGN_OR_RETURN(float partial, r.Float("partial_rotary_factor", 1.0f));
  if (partial != 1.0f)
    return UnimplementedError(where + ": partial rotary embedding is not supported");
  SI_RETURN_IF_ERROR(ParseRope(r, where, c));
  SI_RETURN_IF_ERROR(ParseSlidingWindow(r, model_type, where, c));
  if (gemma) {
    c.post_norms = true;
    c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
    SI_ASSIGN_OR_RETURN(float qpas, r.Float("query_pre_attn_scalar",
                                            static_cast<float>(c.head_dim)));
    if (!(qpas > 0.0f)) return InvalidArgumentError(where + ": query_pre_attn_scalar <= 0");
    c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(qpas)));
    SI_ASSIGN_OR_RETURN(c.attn_softcap, r.Float("attn_logit_softcapping", 0.0f));
    SI_ASSIGN_OR_RETURN(c.final_softcap, r.Float("final_logit_softcapping", 0.0f));
  }
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext(where);
  return c;
}

}  // namespace

StatusOr<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, const std::string& where) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(where + " is not valid JSON");
  try {
    return ParseConfig(j, where);
  } catch (const Json::exception& e) {  // not expected: every access is type-checked
    return InvalidArgumentError(where + ": " + e.what());
  }
}

StatusOr<std::unique_ptr<Model>> ModelFromHfDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(config_path, ec))
    return NotFoundError("Hugging Face model directory '" + dir + "' has no config.json");
  SI_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  SI_ASSIGN_OR_RETURN(ModelConfig c, ModelConfigFromHfJson(text, config_path));
  SI_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsSet> set, SafetensorsSet::OpenDirectory(dir));

  // No lm_head.weight: the head is the embedding whatever tie_word_embeddings says.
  if (set->Find("lm_head.weight") == nullptr) c.tied_output = true;
  auto model = std::make_unique<Model>(c, ModelWeights{}, dir);
  WeightReader r(*set, *model);
  // Names in LlamaTensorNames order: embedding, final norm, output, layer prefix; attention
  // (norm, q, k, v, o, q/k/v biases); feed-forward (norm, gate, up, down).
  // Gemma names its pre-FFN norm pre_feedforward_layernorm and uses post_attention_layernorm for
  // the attention block's output.
  const bool gemma = IsGemma(c.architecture);
  const LlamaTensorNames names{
      "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.",
      "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
      "self_attn.k_proj.bias", "self_attn.v_proj.bias",
      gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight",
      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
      "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
      "post_feedforward_layernorm.weight"};
  const LlamaTensorReaders read{
      .matrix = [&r](const std::string& name, int64_t rows,
                     int64_t cols) { return r.Matrix(name, rows, cols); },
      // Gemma's vectors are all RMSNorm gains, applied as (1 + w).
      .vector = [&r, gemma](const std::string& name, int64_t size) {
        return gemma ? r.VectorPlusOne(name, size) : r.Vector(name, size);
      }};
  SI_ASSIGN_OR_RETURN(ModelWeights w, ReadLlamaWeights(c, names, read));
  model->set_weights(std::move(w));
  for (auto& file : set->ReleaseMappedFiles()) model->AdoptFile(std::move(file));
  return model;
}

std::string HfChatTemplate(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  auto text = ReadFileToString(path.string());
  if (!text.ok()) return "";
  Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  auto it = j.find("chat_template");
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const Json& e : *it) {
      if (!e.is_object()) continue;
      auto name = e.find("name");
      auto tmpl = e.find("template");
      if (name != e.end() && tmpl != e.end() && name->is_string() && tmpl->is_string() &&
          name->get<std::string>() == "default")
        return tmpl->get<std::string>();
    }
  }
  return "";
}

}  // namespace specinfer
