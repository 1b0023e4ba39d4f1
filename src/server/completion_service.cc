#include "server/completion_service.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <random>

namespace specinfer {

namespace {

ApiError ContextExceeded(std::string message, std::string param) {
  ApiError e = ApiError::Invalid(std::move(message), std::move(param));
  e.error_code = "context_length_exceeded";
  return e;
}

uint64_t RandomSeed() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return gen();
}

}  // namespace

CompletionService::CompletionService(RequestQueue& queue, ServerMetrics& metrics,
                                     ServiceOptions options)
    : queue_(queue), metrics_(metrics), options_(std::move(options)) {}

ApiError CompletionService::CheckParameters(const CompletionRequest& r) const {
  using L = RequestLimits;
  if (!r.model.empty() && r.model != options_.served_model_name) {
    ApiError e{StatusCode::kNotFound,
               "The model '" + r.model + "' does not exist; this server serves '" +
                   options_.served_model_name + "'",
               "model", "model_not_found", 0};
    return e;
  }
  // (The server's defaults for absent fields were checked at start.)
  if (r.temperature && !(*r.temperature >= 0.0f && *r.temperature <= L::kMaxTemperature))
    return ApiError::Invalid("temperature must be between 0 and 2", "temperature");
  if (r.top_p && !(*r.top_p > 0.0f && *r.top_p <= 1.0f))
    return ApiError::Invalid("top_p must be in (0, 1]", "top_p");
  if (r.top_k && *r.top_k < -1)
    return ApiError::Invalid("top_k must be -1 or 0 (off) or positive", "top_k");
  if (r.n < 1 || r.n > L::kMaxSequences)
    return ApiError::Invalid("n must be between 1 and " + std::to_string(L::kMaxSequences), "n");
  const size_t num_prompts = r.chat ? 1 : r.prompts.size();
  if (num_prompts == 0) return ApiError::Invalid("prompt must not be empty", "prompt");
  if (num_prompts * static_cast<size_t>(r.n) > static_cast<size_t>(L::kMaxSequences))
    return ApiError::Invalid("a request may ask for at most " + std::to_string(L::kMaxSequences) +
                                 " sequences (prompts x n)",
                             "n");
  if (r.logprobs < -1 || r.logprobs > L::kMaxLogprobs)
    return ApiError::Invalid("logprobs must be between 0 and " + std::to_string(L::kMaxLogprobs),
                             r.chat ? "top_logprobs" : "logprobs");
  if (r.stop.size() > static_cast<size_t>(L::kMaxStopStrings))
    return ApiError::Invalid(
        "at most " + std::to_string(L::kMaxStopStrings) + " stop strings are allowed", "stop");
  for (const std::string& s : r.stop) {
    if (s.empty()) return ApiError::Invalid("stop strings must not be empty", "stop");
    if (s.size() > static_cast<size_t>(L::kMaxStopStringBytes))
      return ApiError::Invalid(
          "stop strings must be at most " + std::to_string(L::kMaxStopStringBytes) + " bytes",
          "stop");
  }
  if (r.max_tokens && *r.max_tokens < 0)
    return ApiError::Invalid("max_tokens must be at least 0", "max_tokens");
  Status spec = ValidateSpeculation(r.speculation, engine().model().config().n_layers);
  if (!spec.ok()) return ApiError::FromStatus(spec, "speculation");
  if (r.speculation.enabled && !options_.speculation_available)
    return ApiError::Invalid("speculation is not enabled on this server",
                             "speculation.enabled");
  for (const DraftSpec& d : r.speculation.drafts) {
    if (d.kind != DraftSpec::Kind::kModel) continue;
    const std::string name = d.ToString();
    if (std::find(options_.model_drafts.begin(), options_.model_drafts.end(), name) ==
        options_.model_drafts.end())
      return ApiError::Invalid("draft '" + name +
                                   "' was not loaded at start (start the server with --draft " +
                                   name + ")",
                               "speculation.draft");
  }
  return {};
}

ApiError CompletionService::Prepare(const CompletionRequest& r, PreparedRequest* out) const {
  *out = PreparedRequest();
  if (ApiError e = CheckParameters(r); !e.ok()) return e;
  const Engine& engine = this->engine();
  const int64_t context = engine.context_length();
  const int32_t vocab = engine.tokenizer().vocab_size();
  const std::string prompt_param = r.chat ? "messages" : "prompt";

  // Tokenize every prompt: [prompt][ids], with its stop tokens.
  std::vector<std::vector<int32_t>> prompts;
  out->choices_per_prompt = r.n;
  std::vector<int32_t> stop_tokens = engine.default_stop_tokens();
  if (r.chat) {
    const std::string& tmpl = r.chat_template.empty() ? options_.chat_template : r.chat_template;
    auto ids = engine.EncodeChat(r.messages, tmpl, &stop_tokens);
    if (!ids.ok()) return ApiError::FromStatus(ids.status(), "messages");
    prompts.push_back(std::move(ids).value());
  } else {
    for (const PromptInput& p : r.prompts) {
      if (p.is_tokens) {
        if (p.tokens.empty())
          return ApiError::Invalid("a token prompt must not be empty", "prompt");
        for (int32_t t : p.tokens)
          if (t < 0 || t >= vocab)
            return ApiError::Invalid("prompt token " + std::to_string(t) +
                                         " is outside the vocabulary (0.." +
                                         std::to_string(vocab - 1) + ")",
                                     "prompt");
        prompts.push_back(p.tokens);
      } else {
        auto ids = engine.EncodePrompt(p.text);
        if (!ids.ok()) return ApiError::FromStatus(ids.status(), "prompt");
        prompts.push_back(std::move(ids).value());
      }
    }
  }

  if (r.ignore_eos) stop_tokens.clear();

  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const int64_t prompt_len = static_cast<int64_t>(prompts[pi].size());
    if (prompt_len > context) {
      return ContextExceeded("This model's maximum context length is " + std::to_string(context) +
                                 " tokens, but the prompt has " + std::to_string(prompt_len) +
                                 " tokens",
                             prompt_param);
    }
    int64_t max_tokens;
    if (r.max_tokens) {
      max_tokens = *r.max_tokens;
      if (max_tokens > context - prompt_len) {  // (no overflow: max_tokens may be INT64_MAX)
        const int64_t requested = max_tokens > std::numeric_limits<int64_t>::max() - prompt_len
                                      ? std::numeric_limits<int64_t>::max()
                                      : prompt_len + max_tokens;
        return ContextExceeded("This model's maximum context length is " + std::to_string(context) +
                                   " tokens. However, you requested " + std::to_string(requested) +
                                   " tokens (" + std::to_string(prompt_len) + " in the prompt, " +
                                   std::to_string(max_tokens) +
                                   " in the completion). Reduce the prompt or max_tokens.",
                               "max_tokens");
      }
    } else {
      // The server's default, else the endpoint's; never beyond the context.
      max_tokens = context - prompt_len;
      const int64_t cap =
          options_.defaults.max_tokens > 0 ? options_.defaults.max_tokens : r.default_max_tokens;
      if (cap >= 0) max_tokens = std::min(max_tokens, cap);
    }
    out->prompt_tokens += static_cast<int32_t>(prompt_len);

    for (int32_t j = 0; j < r.n; ++j) {
      SequenceJob job;
      job.index = static_cast<int32_t>(pi) * r.n + j;
      job.generate.prompt_tokens = prompts[pi];
      job.generate.max_new_tokens = static_cast<int32_t>(max_tokens);
      const GenerationDefaults& d = options_.defaults;
      job.generate.sampling.temperature = r.temperature.value_or(d.temperature);
      job.generate.sampling.top_p = r.top_p.value_or(d.top_p);
      job.generate.sampling.top_k = std::max(r.top_k.value_or(d.top_k), 0);
      job.generate.sampling.seed =
          r.seed ? static_cast<uint64_t>(*r.seed) + static_cast<uint64_t>(j) : RandomSeed();
      job.generate.stop_tokens = stop_tokens;
      job.stop_strings = r.stop;
      job.top_logprobs = r.logprobs;
      job.speculation = r.speculation;
      Status s = job.generate.sampling.Validate();
      if (!s.ok()) return ApiError::FromStatus(s);
      out->jobs.push_back(std::move(job));
    }
  }
  return {};
}

ApiError CompletionService::Start(const CompletionRequest& request, PreparedRequest* prepared,
                                  std::shared_ptr<ResponseStream>* stream) {
  if (ApiError e = Prepare(request, prepared); !e.ok()) return e;
  // Submit consumes the jobs; keep what the response writers need (prompt ids, indices).
  auto submitted = queue_.Submit(prepared->jobs);
  if (!submitted.ok()) return ApiError::FromStatus(submitted.status());
  *stream = std::move(submitted).value();
  return {};
}

}  // namespace specinfer
