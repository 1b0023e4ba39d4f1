#include "model/loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "model/dequantize.h"
#include "model/gguf_loader.h"
#include "model/hf_loader.h"
#include "model/llama2c_loader.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/llama2c_tokenizer.h"

namespace specinfer {

StatusOr<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("model '" + path + "' not found");
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(std::filesystem::path(path) / "config.json", ec))
      return ModelFormat::kHfDirectory;
    return NotFoundError("'" + path + "' is a directory without config.json; pass a Hugging "
                         "Face model directory, a GGUF file or a llama2.c checkpoint");
  }
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string_view(magic, 4) == "GGUF") return ModelFormat::kGguf;
  return ModelFormat::kLlama2c;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelAndTokenizer(path, "-"));
  return std::move(loaded.model);
}

StatusOr<LoadedModel> LoadModelAndTokenizer(const std::string& model_path,
                                            const std::string& tokenizer_path) {
  // tokenizer_path "-" (internal): load the model only.
  const bool want_tokenizer = tokenizer_path != "-";
  LoadedModel out;
  SI_ASSIGN_OR_RETURN(out.format, DetectModelFormat(model_path));
  if (out.format == ModelFormat::kGguf) {
    SI_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
    std::unique_ptr<Tokenizer> tokenizer;
    std::string chat_template;
    if (const GgufValue* t = gguf->Find("tokenizer.chat_template")) {
      SI_ASSIGN_OR_RETURN(std::string_view tmpl, t->AsString());
      chat_template = std::string(tmpl);
    }
    SI_ASSIGN_OR_RETURN(out.model, ModelFromGguf(*gguf));
    if (want_tokenizer && tokenizer_path.empty()) {
      // A draft with its own vocabulary (spec/draft_vocab.h) carries the LLM's whole tokenizer,
      // which must hold every token of its table.
      const std::vector<int32_t>& draft_ids = out.model->config().draft_token_ids;
      int32_t tokens = out.model->config().vocab_size;
      if (!draft_ids.empty()) {
        const GgufValue* t = gguf->Find("tokenizer.ggml.tokens");
        tokens = t != nullptr ? static_cast<int32_t>(t->size()) : 0;
        const int32_t largest = *std::max_element(draft_ids.begin(), draft_ids.end());
        if (largest >= tokens)
          return InvalidArgumentError("GGUF '" + model_path + "': its draft vocabulary names " +
                                      "token " + std::to_string(largest) + " but its tokenizer " +
                                      "has " + std::to_string(tokens) + " tokens");
      }
      SI_ASSIGN_OR_RETURN(out.tokenizer, TokenizerFromGguf(*gguf, tokens));
    }
    out.chat_template = std::move(chat_template);
  } else if (out.format == ModelFormat::kHfDirectory) {
    SI_ASSIGN_OR_RETURN(out.model, ModelFromHfDirectory(model_path));
    out.chat_template = HfChatTemplate(model_path);
  } else {
    SI_ASSIGN_OR_RETURN(out.model, LoadLlama2cCheckpoint(model_path));
  }
  if (!want_tokenizer || out.tokenizer) return out;

  std::string path = tokenizer_path;
  if (path.empty() && out.format == ModelFormat::kHfDirectory) {
    auto inside = std::filesystem::path(model_path) / "tokenizer.json";
    if (!std::filesystem::exists(inside)) {
      return NotFoundError("no tokenizer for Hugging Face model '" + model_path +
                           "': pass --tokenizer PATH (looked for " + inside.string() + ")");
    }
    path = inside.string();
  } else if (path.empty()) {
    auto beside = std::filesystem::path(model_path).parent_path() / "tokenizer.bin";
    if (!std::filesystem::exists(beside)) {
      return NotFoundError("no tokenizer for llama2.c model '" + model_path +
                           "': pass --tokenizer PATH (looked for " + beside.string() + ")");
    }
    path = beside.string();
  }
  if (path.ends_with(".json")) {
    SI_ASSIGN_OR_RETURN(auto tok, BpeTokenizer::FromTokenizerJson(path));
    out.tokenizer = std::move(tok);
  } else {
    SI_ASSIGN_OR_RETURN(auto tok, Llama2cTokenizer::Load(path, out.model->config().vocab_size));
    out.tokenizer = std::move(tok);
  }
  // A model may pad its embedding beyond the vocabulary, never the other way round.
  if (out.tokenizer->vocab_size() > out.model->config().vocab_size) {
    return InvalidArgumentError("tokenizer '" + path + "' has " +
                                std::to_string(out.tokenizer->vocab_size()) +
                                " tokens but the model only " +
                                std::to_string(out.model->config().vocab_size));
  }
  return out;
}

StatusOr<LoadedModel> LoadModelForServing(const std::string& model_path,
                                          const ServingLoadOptions& o) {
  if (o.context_length < 0) return InvalidArgumentError("context length must be >= 0");
  StatusOr<LoadedModel> loaded = LoadModelAndTokenizer(model_path, o.tokenizer_path);
  // Whatever kept the tokenizer from loading, the model alone may still load ("-": no tokenizer).
  if (!loaded.ok() && o.tokenizer_optional) loaded = LoadModelAndTokenizer(model_path, "-");
  SI_RETURN_IF_ERROR(loaded.status());
  LoadedModel out = std::move(loaded).value();
  if (!o.draft && !out.model->config().draft_token_ids.empty())
    return InvalidArgumentError("'" + model_path + "' is a draft model with its own vocabulary "
                                "(specinfer.draft_token_ids): use it as a draft (--draft "
                                "model:PATH), not as the model");
  if (o.context_length > 0 && o.context_length < out.model->config().max_seq_len)
    out.model->set_context_length(o.context_length);
  if (o.prefault) out.model->Prefault(o.progress);
  if (o.dequantize) {
    SI_ASSIGN_OR_RETURN(std::unique_ptr<Model> f32, DequantizeToF32(*out.model));
    out.model = std::move(f32);
  }
  return out;
}

}  // namespace specinfer
