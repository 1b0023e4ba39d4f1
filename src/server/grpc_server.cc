#include "server/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "proto/specinfer.grpc.pb.h"
#include "server/api_key.h"
#include "server/grpc_listen.h"
#include "server/text_output.h"

namespace specinfer {

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);

grpc::Status ToGrpc(const ApiError& e) {
  std::string message = e.message;
  if (!e.param.empty() && message.find(e.param) == std::string::npos)
    message += " (" + e.param + ")";
  return grpc::Status(static_cast<grpc::StatusCode>(e.code), message);
}

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// The protocol-neutral request of a GenerateRequest (types are already right; ranges are checked
// by CompletionService).
ApiError FromProto(const v1::GenerateRequest& in, CompletionRequest* out) {
  *out = CompletionRequest();
  out->model = in.model();
  switch (in.prompt_case()) {
    case v1::GenerateRequest::kText:
      out->prompts.push_back(PromptInput{false, in.text(), {}});
      break;
    case v1::GenerateRequest::kTokens:
      out->prompts.push_back(
          PromptInput{true, "", {in.tokens().ids().begin(), in.tokens().ids().end()}});
      break;
    case v1::GenerateRequest::kChat:
      out->chat = true;
      for (const v1::ChatMessage& m : in.chat().messages())
        out->messages.push_back(ChatMessage{m.role(), m.content()});
      out->chat_template = in.chat().chat_template();
      break;
    default:
      return ApiError::Invalid("a prompt is required (text, tokens or chat)", "prompt");
  }
  if (in.has_sampling()) {
    const v1::SamplingParams& s = in.sampling();
    if (s.has_temperature()) out->temperature = s.temperature();
    if (s.has_top_p()) out->top_p = s.top_p();
    if (s.has_top_k()) out->top_k = s.top_k();
    if (s.has_seed()) out->seed = static_cast<int64_t>(s.seed());
  }
  if (in.has_max_tokens()) out->max_tokens = in.max_tokens();
  out->stop.assign(in.stop().begin(), in.stop().end());
  out->ignore_eos = in.ignore_eos();
  if (in.has_logprobs()) {
    if (in.logprobs() < 0) return ApiError::Invalid("logprobs must be at least 0", "logprobs");
    out->logprobs = in.logprobs();
  }
  out->n = in.n() == 0 ? 1 : in.n();
  if (in.has_speculation()) {
    const v1::SpeculationParams& sp = in.speculation();
    out->speculation.enabled = sp.enabled();
    for (int i = 0; i < sp.draft_size(); ++i) {
      auto d = ParseDraftSpec(sp.draft(i), kServingLimits);
      if (!d.ok())
        return ApiError::FromStatus(d.status(), "speculation.draft[" + std::to_string(i) + "]");
      out->speculation.drafts.push_back(std::move(d).value());
    }
    out->speculation.tree.assign(sp.tree().begin(), sp.tree().end());
  }
  return {};
}

class SpecInferService final : public v1::SpecInfer::Service {
 public:
  SpecInferService(CompletionService& service, std::string api_key)
      : service_(service), api_key_(std::move(api_key)) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    return Count("Generate", DoGenerate(ctx, req, writer));
  }

  grpc::Status Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                        v1::TokenizeResponse* resp) override {
    return Count("Tokenize", DoTokenize(ctx, req, resp));
  }

  grpc::Status Detokenize(grpc::ServerContext* ctx, const v1::DetokenizeRequest* req,
                          v1::DetokenizeResponse* resp) override {
    return Count("Detokenize", DoDetokenize(ctx, req, resp));
  }

  grpc::Status ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* resp) override {
    grpc::Status auth = Authorize(ctx);
    if (!auth.ok()) return Count("ListModels", auth);
    v1::ModelInfo* m = resp->add_models();
    m->set_id(service_.model_name());
    m->set_context_length(service_.engine().context_length());
    m->set_vocab_size(service_.engine().tokenizer().vocab_size());
    return Count("ListModels", grpc::Status::OK);
  }

  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    const ServingGauges g = service_.queue().gauges();
    resp->set_status(v1::HealthResponse::SERVING);
    resp->set_queued(static_cast<int32_t>(g.queued));
    resp->set_running(static_cast<int32_t>(g.running));
    return Count("Health", grpc::Status::OK);
  }

 private:
  grpc::Status Count(const char* method, grpc::Status s) {
    service_.metrics().CountRequest(std::string("/specinfer.v1.SpecInfer/") + method,
                                    StatusCodeName(static_cast<StatusCode>(s.error_code())));
    return s;
  }

  grpc::Status Authorize(grpc::ServerContext* ctx) const {
    if (api_key_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end())
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing API key: send metadata 'authorization: Bearer KEY'");
    const std::string_view value(it->second.data(), it->second.size());
    if (!BearerKeyMatches(value, api_key_))
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "incorrect API key provided");
    return grpc::Status::OK;
  }

  grpc::Status CheckModel(const std::string& model) const {
    if (!model.empty() && model != service_.model_name())
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "the model '" + model + "' does not exist");
    return grpc::Status::OK;
  }

  grpc::Status DoGenerate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                          grpc::ServerWriter<v1::GenerateResponse>* writer) {
    if (grpc::Status auth = Authorize(ctx); !auth.ok()) return auth;
    CompletionRequest request;
    if (ApiError e = FromProto(*req, &request); !e.ok()) return ToGrpc(e);
    PreparedRequest prepared;
    std::shared_ptr<ResponseStream> stream;
    if (ApiError e = service_.Start(request, &prepared, &stream); !e.ok()) return ToGrpc(e);
    while (!stream->finished()) {
      if (ctx->IsCancelled()) {
        service_.Cancel(stream);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
      }
      std::optional<StreamEvent> ev = stream->Next(kPollInterval);
      if (!ev) continue;
      if (ev->type == StreamEvent::Type::kError) {
        service_.Cancel(stream);
        return ToGrpc(ev->error);
      }
      v1::GenerateResponse msg;
      msg.set_index(ev->index);
      msg.set_text(ev->text);
      for (int32_t t : ev->tokens) msg.add_token_ids(t);
      for (const TokenLogprob& lp : ev->logprobs) {
        v1::TokenLogprob* out = msg.add_logprobs();
        out->set_token_id(lp.token);
        out->set_logprob(lp.logprob);
        for (const auto& [id, alt] : lp.top) {
          v1::TopLogprob* t = out->add_top();
          t->set_token_id(id);
          t->set_logprob(alt);
        }
      }
      if (ev->type == StreamEvent::Type::kFinished) {
        msg.set_finish_reason(ToProto(ev->finish_reason));
        v1::Usage* u = msg.mutable_usage();
        u->set_prompt_tokens(ev->prompt_tokens);
        u->set_completion_tokens(ev->completion_tokens);
        u->set_cached_tokens(ev->cached_prompt_tokens);
        u->set_total_tokens(ev->prompt_tokens + ev->completion_tokens);
      }
      if (!writer->Write(msg)) {
        service_.Cancel(stream);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status DoTokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                          v1::TokenizeResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (grpc::Status s = CheckModel(req->model()); !s.ok()) return s;
    const Tokenizer& tok = service_.engine().tokenizer();
    auto ids =
        tok.Encode(req->text(), req->add_bos() && tok.add_bos_by_default(), req->parse_special());
    if (!ids.ok()) return ToGrpc(ids.status());
    for (int32_t id : *ids) resp->add_token_ids(id);
    return grpc::Status::OK;
  }

  grpc::Status DoDetokenize(grpc::ServerContext* ctx, const v1::DetokenizeRequest* req,
                            v1::DetokenizeResponse* resp) {
    if (grpc::Status s = Authorize(ctx); !s.ok()) return s;
    if (grpc::Status s = CheckModel(req->model()); !s.ok()) return s;
    const Tokenizer& tok = service_.engine().tokenizer();
    std::vector<int32_t> ids(req->token_ids().begin(), req->token_ids().end());
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size())
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "token id " + std::to_string(id) + " is outside the vocabulary");
    resp->set_text(SanitizeUtf8(tok.Decode(ids)));
    return grpc::Status::OK;
  }

  CompletionService& service_;
  const std::string api_key_;
};

class GrpcFrontend final : public Frontend {
 public:
  GrpcFrontend(std::unique_ptr<SpecInferService> service, BoundGrpcServer bound)
      : service_(std::move(service)), server_(std::move(bound.server)), port_(bound.port) {}
  ~GrpcFrontend() override { Stop(); }

  int port() const override { return port_; }
  void Stop() override {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }

 private:
  std::unique_ptr<SpecInferService> service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Frontend>> StartGrpcServer(CompletionService& service,
                                                    GrpcServerOptions options) {
  auto rpc = std::make_unique<SpecInferService>(service, options.api_key);
  const bool ipv6 = options.host.find(':') != std::string::npos;
  const std::string address =
      (ipv6 ? "[" + options.host + "]" : options.host) + ":" + std::to_string(options.port);
  grpc::Service* const services[] = {rpc.get()};
  GrpcListenOptions listen{.address = address};
  listen.max_receive_bytes = static_cast<int64_t>(options.max_message_bytes);
  auto bound = BindGrpcServer(services, listen);
  if (!bound.ok()) return bound.status().WithContext("gRPC");
  return std::unique_ptr<Frontend>(new GrpcFrontend(std::move(rpc), std::move(*bound)));
}

}  // namespace specinfer
