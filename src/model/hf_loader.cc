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

StatusOr<ModelConfig> ParseConfig(const Json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgumentError(where + " is not a JSON object");
  ConfigReader r(j, where);
  ModelConfig c;
  SI_ASSIGN_OR_RETURN(std::string model_type, r.String("model_type"));
  if (model_type != "llama" && model_type != "qwen2") {
    return UnimplementedError(where + ": model_type '" + model_type +
                              "' is not supported (llama, qwen2)");
  }
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
  SI_ASSIGN_OR_RETURN(c.rope_theta, r.Float("rope_theta", 10000.0f));
  SI_ASSIGN_OR_RETURN(c.norm_eps, r.Float("rms_norm_eps"));
  // transformers' LlamaConfig and Qwen2Config both default to untied embeddings.
  SI_ASSIGN_OR_RETURN(bool tied, r.Bool("tie_word_embeddings", false));
  c.tied_output = tied;
  if (model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases
    SI_ASSIGN_OR_RETURN(bool sliding, r.Bool("use_sliding_window", false));
    if (sliding) return UnimplementedError(where + ": sliding-window attention is not supported");
  } else {
    SI_ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
    SI_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
    if (mlp_bias) return UnimplementedError(where + ": mlp_bias is not supported");
  }
  SI_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "silu"));
  if (act != "silu")
    return UnimplementedError(where + ": hidden_act '" + act + "' is not supported (silu)");
  SI_ASSIGN_OR_RETURN(float partial, r.Float("partial_rotary_factor", 1.0f));
  if (partial != 1.0f)
    return UnimplementedError(where + ": partial rotary embedding is not supported");
  if (const Json* s = r.Find("rope_scaling")) {
    SI_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*s, where));
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
  constexpr LlamaTensorNames kNames{
      "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.",
      "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
      "self_attn.k_proj.bias", "self_attn.v_proj.bias", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  const LlamaTensorReaders read{
      .matrix = [&r](const std::string& name, int64_t rows,
                     int64_t cols) { return r.Matrix(name, rows, cols); },
      .vector = [&r](const std::string& name, int64_t size) { return r.Vector(name, size); }};
  SI_ASSIGN_OR_RETURN(ModelWeights w, ReadLlamaWeights(c, kNames, read));
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
