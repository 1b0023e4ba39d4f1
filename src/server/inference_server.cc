#include "server/inference_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

namespace specinfer {

std::string DefaultServedModelName(const std::string& model_path) {
  std::filesystem::path p(model_path);
  if (!p.has_filename()) p = p.parent_path();  // "dir/"
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return p.filename().string();
  return p.stem().string();
}

StatusOr<std::unique_ptr<InferenceServer>> InferenceServer::Start(InferenceServerOptions options) {
  // KV memory (and the draft models' sessions) for every sequence the batch may run at once.
  options.engine.max_sequences =
      std::max(options.engine.max_sequences, options.queue.batch.max_sequences);
  SI_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options.engine));
  if (options.served_model_name.empty())
    options.served_model_name = DefaultServedModelName(options.engine.model_path);
  return Start(std::move(engine), std::move(options));
}

StatusOr<std::unique_ptr<InferenceServer>> InferenceServer::Start(std::unique_ptr<Engine> engine,
                                                                  InferenceServerOptions options) {
  if (!engine) return InvalidArgumentError("no engine");
  if (options.queue.max_queue < 1) return InvalidArgumentError("max queue must be >= 1");
  if (options.queue.batch.max_sequences < 1 || options.queue.batch.max_batch_tokens < 1)
    return InvalidArgumentError("max batch sequences and tokens must be >= 1");
  if (options.served_model_name.empty())
    options.served_model_name = DefaultServedModelName(options.engine.model_path);
  if (options.served_model_name.empty()) options.served_model_name = "default";
  if (!options.chat_template.empty()) {
    auto named = ChatTemplate::Named(options.chat_template);
    if (!named.ok()) return named.status();
  }
  SI_RETURN_IF_ERROR(options.defaults.Validate());
  if (!(options.defaults == GenerationDefaults{}))  // at warn, with the other start-up lines
    spdlog::warn("requests that leave them out get {}", options.defaults.ToString());
  auto s = std::unique_ptr<InferenceServer>(new InferenceServer());
  s->engine_ = std::move(engine);
  s->metrics_ = std::make_unique<ServerMetrics>();
  if (!s->engine_->speculators().empty()) {  // those loaded at start (--draft) are the default
    options.queue.default_drafts.clear();
    for (const Speculator* sp : s->engine_->speculators())
      options.queue.default_drafts.push_back(sp->name());
  }
  s->queue_ = std::make_unique<RequestQueue>(*s->engine_, *s->metrics_, options.queue);
  ServiceOptions so;
  so.served_model_name = options.served_model_name;
  so.chat_template = options.chat_template;
  so.defaults = options.defaults;
  so.speculation_available = true;
  for (const Speculator* sp : s->engine_->speculators())
    if (sp->name().starts_with("model:")) so.model_drafts.push_back(sp->name());
  s->service_ = std::make_unique<CompletionService>(*s->queue_, *s->metrics_, so);
  options.grpc.max_message_bytes = options.http.max_body_bytes;
  SI_ASSIGN_OR_RETURN(s->http_, StartHttpServer(*s->service_, options.http));
  if (options.enable_grpc) {
    SI_ASSIGN_OR_RETURN(s->grpc_, StartGrpcServer(*s->service_, options.grpc));
  }
  return s;
}

InferenceServer::~InferenceServer() { Shutdown(); }

void InferenceServer::Shutdown() {
  if (queue_) queue_->Shutdown();
  if (http_) http_->Stop();
  if (grpc_) grpc_->Stop();
}

}  // namespace specinfer
