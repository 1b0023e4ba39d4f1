// BpeTokenizer's file formats: the vocabulary of a GGUF file (tokenizer.ggml.*) and Hugging Face
// tokenizer.json (with tokenizer_config.json beside it). Both build a BpeVocab for Create.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/mapped_file.h"
#include "tokenizer/bpe_tokenizer.h"

namespace specinfer {
namespace {

// Create's InvalidArgument means inconsistent data; coming from a file, that is DataLoss.
Status AsDataLoss(const Status& s, std::string_view context) {
  const StatusCode code =
      s.code() == StatusCode::kInvalidArgument ? StatusCode::kDataLoss : s.code();
  return Status(code, s.message()).WithContext(context);
}

// The pre-tokenizer patterns as Hugging Face tokenizer.json files spell them (for recognising a
// Split); their PCRE2 versions, which the encoder runs, are in bpe_tokenizer.cc.
constexpr std::string_view kGpt2Hf =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Hf =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Hf =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

// ---- GGUF ---------------------------------------------------------------------------------------

StatusOr<std::pair<PreTokenizer, bool>> BpeTokenizer::PreTokenizerFromGgufName(
    std::string_view pre) {
  if (pre == "gpt2" || pre == "gpt-2") return std::make_pair(PreTokenizer::kGpt2, false);
  if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    return std::make_pair(PreTokenizer::kSmolLM, false);
  }
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe") {
    return std::make_pair(PreTokenizer::kLlama3, true);
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    return std::make_pair(PreTokenizer::kQwen2, false);
  }
  return UnimplementedError(
      "unsupported tokenizer.ggml.pre \"" + std::string(pre) +
      "\" (supported: gpt2, smollm, starcoder, refact, llama3, llama-v3, llama-bpe, qwen2, "
      "deepseek-r1-qwen)");
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGgufVocab(
    std::span<const std::string_view> tokens, std::span<const std::string_view> merges,
    std::span<const int32_t> token_types, int32_t bos_id, int32_t eos_id,
    std::optional<bool> add_bos, std::string_view pre) {
  SI_ASSIGN_OR_RETURN(auto pre_and_ignore, PreTokenizerFromGgufName(pre));
  if (!token_types.empty() && token_types.size() != tokens.size()) {
    return DataLossError("tokenizer.ggml.token_type has " + std::to_string(token_types.size()) +
                         " entries for " + std::to_string(tokens.size()) + " tokens");
  }
  BpeVocab v;
  v.pre = pre_and_ignore.first;
  v.ignore_merges = pre_and_ignore.second;
  v.bos_id = bos_id;
  v.eos_id = eos_id;
  v.add_bos = add_bos.value_or(v.pre == PreTokenizer::kLlama3);
  for (size_t i = 0; i < token_types.size(); ++i) {
    const int32_t t = token_types[i];
    if (t == 2 || t == 3) v.special_ids.push_back(static_cast<int32_t>(i));
    if (t == 4) v.user_defined_ids.push_back(static_cast<int32_t>(i));
  }
  v.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    // As llama.cpp: the separator is the first space after the first byte.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos) {
      return DataLossError("tokenizer.ggml.merges[" + std::to_string(r) + "] \"" + std::string(m) +
                           "\" is not two tokens separated by a space");
    }
    v.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
  }
  v.tokens.assign(tokens.begin(), tokens.end());
  auto tok = Create(std::move(v));
  if (!tok.ok()) return AsDataLoss(tok.status(), "GGUF vocabulary");
  return tok;
}

// ---- Hugging Face tokenizer.json ----------------------------------------------------------------
namespace {

using Json = nlohmann::json;

bool IsNullOr(const Json& obj, const char* key, const Json& value) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || *it == value;
}

// Recognises the pre_tokenizer configurations that PreTokenizer covers.
StatusOr<PreTokenizer> DetectPreTokenizer(const Json& pre) {
  auto unsupported = [&pre](const std::string& why) {
    return UnimplementedError("unsupported tokenizer.json pre_tokenizer (" + why +
                              "): " + pre.dump().substr(0, 400));
  };
  if (pre.is_null()) return unsupported("none: not a byte-level BPE");
  std::vector<Json> steps;
  if (pre.value("type", "") == "Sequence") {
    const Json& list = pre.at("pretokenizers");
    steps.assign(list.begin(), list.end());
  } else {
    steps.push_back(pre);
  }
  if (steps.empty() || steps.back().value("type", "") != "ByteLevel") {
    return unsupported("the last step must be ByteLevel");
  }
  const Json& bl = steps.back();
  if (bl.value("add_prefix_space", false)) return unsupported("ByteLevel add_prefix_space");
  const bool use_regex = bl.value("use_regex", true);
  steps.pop_back();
  if (use_regex) {
    if (steps.empty()) return PreTokenizer::kGpt2;
    if (steps.size() == 1 && steps[0].value("type", "") == "Digits" &&
        steps[0].value("individual_digits", false)) {
      return PreTokenizer::kSmolLM;
    }
    return unsupported("steps before ByteLevel(use_regex=true)");
  }
  if (steps.size() != 1 || steps[0].value("type", "") != "Split") {
    return unsupported("expected one Split before ByteLevel(use_regex=false)");
  }
  const Json& split = steps[0];
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    return unsupported("Split must be Isolated, not inverted");
  }
  const Json& pattern = split.at("pattern");
  if (!pattern.contains("Regex")) return unsupported("Split pattern is not a Regex");
  const std::string regex = pattern.at("Regex").get<std::string>();
  if (regex == kGpt2Hf) return PreTokenizer::kGpt2;
  if (regex == kLlama3Hf) return PreTokenizer::kLlama3;
  if (regex == kQwen2Hf) return PreTokenizer::kQwen2;
  return unsupported("unknown Split regex");
}

// A token named in tokenizer_config.json: a string, or an AddedToken object with "content".
std::optional<std::string> ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  return std::nullopt;
}

// BOS from a post_processor: TemplateProcessing whose "single" template starts with a
// SpecialToken (Llama 3: "<|begin_of_text|>" $A), possibly inside a Sequence.
std::optional<std::string> TemplateBos(const Json& post) {
  if (!post.is_object()) return std::nullopt;
  if (post.value("type", "") == "Sequence" && post.contains("processors")) {
    for (const Json& p : post.at("processors")) {
      if (auto bos = TemplateBos(p)) return bos;
    }
    return std::nullopt;
  }
  if (post.value("type", "") != "TemplateProcessing") return std::nullopt;
  const Json& single = post.at("single");
  if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) {
    return std::nullopt;
  }
  return single[0].at("SpecialToken").at("id").get<std::string>();
}

StatusOr<BpeVocab> ParseTokenizerJsonImpl(std::string_view tokenizer_json,
                                          std::string_view config_json) {
  const Json doc = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return DataLossError("tokenizer.json is not a JSON object");
  }
  auto model_it = doc.find("model");
  if (model_it == doc.end() || !model_it->is_object()) {
    return DataLossError("tokenizer.json has no \"model\" object");
  }
  const Json& model = *model_it;
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") {
    return UnimplementedError("tokenizer.json model type \"" + type + "\" (only BPE)");
  }
  if (!IsNullOr(model, "dropout", 0.0) && !IsNullOr(model, "dropout", 0)) {
    return UnimplementedError("BPE dropout");
  }
  if (!IsNullOr(model, "continuing_subword_prefix", "") ||
      !IsNullOr(model, "end_of_word_suffix", "")) {
    return UnimplementedError("BPE continuing_subword_prefix / end_of_word_suffix");
  }
  if (model.value("byte_fallback", false)) {
    return UnimplementedError("BPE byte_fallback (a SentencePiece-style vocabulary)");
  }
  const Json& normalizer = doc.value("normalizer", Json());
  if (!normalizer.is_null() && normalizer.value("type", "") != "NFC") {
    return UnimplementedError("tokenizer.json normalizer " + normalizer.dump().substr(0, 200));
  }

  BpeVocab v;
  SI_ASSIGN_OR_RETURN(v.pre, DetectPreTokenizer(doc.value("pre_tokenizer", Json())));
  v.ignore_merges = model.value("ignore_merges", false);
  v.fuse_unk = model.value("fuse_unk", false);

  // Vocabulary, then added tokens (which may extend it, as in Llama 3).
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return DataLossError("tokenizer.json has no model.vocab object");
  }
  std::vector<std::pair<std::string, int64_t>> entries;
  entries.reserve(vocab_it->size());
  int64_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return DataLossError("model.vocab[\"" + it.key() + "\"] is not an integer id");
    }
    entries.emplace_back(it.key(), it.value().get<int64_t>());
    max_id = std::max(max_id, entries.back().second);
  }
  const Json& added = doc.value("added_tokens", Json::array());
  if (!added.is_array()) return DataLossError("tokenizer.json added_tokens is not an array");
  for (const Json& a : added) {
    max_id = std::max(max_id, a.at("id").get<int64_t>());
  }
  if (max_id >= INT32_MAX) return DataLossError("token id " + std::to_string(max_id));
  // Ids must cover [0, max_id] (checked below); testing the count first keeps a tiny file with
  // one huge id from allocating max_id strings.
  if (static_cast<uint64_t>(max_id + 1) > entries.size() + added.size()) {
    return DataLossError("token id " + std::to_string(max_id) + " leaves ids undefined: the file " +
                         "defines only " + std::to_string(entries.size() + added.size()) +
                         " tokens");
  }
  v.tokens.resize(static_cast<size_t>(max_id + 1));
  std::vector<uint8_t> defined(v.tokens.size(), 0);
  for (auto& [text, id] : entries) {
    if (id < 0) return DataLossError("negative token id in model.vocab");
    if (defined[id]) return DataLossError("token id " + std::to_string(id) + " is used twice");
    defined[id] = 1;
    v.tokens[id] = std::move(text);
  }
  for (const Json& a : added) {
    const int64_t id = a.at("id").get<int64_t>();
    if (id < 0) return DataLossError("negative token id in added_tokens");
    const std::string content = a.at("content").get<std::string>();
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false)) {
      return UnimplementedError("added token \"" + content +
                                "\" uses lstrip/rstrip/single_word matching");
    }
    v.tokens[id] = content;  // the added token's text is what matches and what it stands for
    defined[id] = 1;
    (a.value("special", false) ? v.special_ids : v.user_defined_ids)
        .push_back(static_cast<int32_t>(id));
  }
  for (size_t i = 0; i < defined.size(); ++i) {
    if (!defined[i]) return DataLossError("token id " + std::to_string(i) + " is not defined");
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return DataLossError("tokenizer.json has no model.merges array");
  }
  v.merges.reserve(merges_it->size());
  for (const Json& m : *merges_it) {
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return DataLossError("merge \"" + s + "\" is not two tokens separated by one space");
      }
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return DataLossError("merge " + m.dump().substr(0, 100) + " is not \"a b\" or [a, b]");
    }
  }

  auto id_of = [&v](const std::string& text) -> int32_t {
    for (int32_t id : v.special_ids) {
      if (v.tokens[id] == text) return id;
    }
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  };
  if (auto unk = model.find("unk_token"); unk != model.end() && unk->is_string()) {
    v.unk_id = id_of(unk->get<std::string>());
    if (v.unk_id < 0) return DataLossError("unk_token is not in the vocabulary");
  }

  std::optional<std::string> bos = TemplateBos(doc.value("post_processor", Json()));
  v.add_bos = bos.has_value();
  std::optional<std::string> eos;
  if (!config_json.empty()) {
    const Json config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return DataLossError("tokenizer_config.json is not a JSON object");
    }
    if (auto b = ConfigToken(config, "bos_token")) bos = b;
    eos = ConfigToken(config, "eos_token");
    if (auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean()) {
      v.add_bos = it->get<bool>();
    }
  }
  if (bos) {
    v.bos_id = id_of(*bos);
    if (v.bos_id < 0) return DataLossError("bos_token \"" + *bos + "\" is not a token");
  }
  if (eos) {
    v.eos_id = id_of(*eos);
    if (v.eos_id < 0) return DataLossError("eos_token \"" + *eos + "\" is not a token");
  }
  if (v.bos_id < 0) v.add_bos = false;
  return v;
}

}  // namespace

StatusOr<BpeVocab> BpeTokenizer::ParseTokenizerJson(std::string_view tokenizer_json,
                                                    std::string_view config_json) {
  try {
    return ParseTokenizerJsonImpl(tokenizer_json, config_json);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type or missing
    return DataLossError(std::string("malformed tokenizer.json: ") + e.what());
  }
}

StatusOr<BpeVocab> BpeTokenizer::ReadTokenizerJson(const std::string& path) {
  SI_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string config;
  std::error_code ec;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) {
    SI_ASSIGN_OR_RETURN(config, ReadFileToString(config_path.string()));
  }
  auto vocab = ParseTokenizerJson(text, config);
  if (!vocab.ok()) return vocab.status().WithContext(path);
  return vocab;
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJson(const std::string& path) {
  SI_ASSIGN_OR_RETURN(BpeVocab vocab, ReadTokenizerJson(path));
  auto tok = Create(std::move(vocab));
  if (!tok.ok()) return AsDataLoss(tok.status(), path);
  return tok;
}

}  // namespace specinfer
