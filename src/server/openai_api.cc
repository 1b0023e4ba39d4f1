#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "server/text_output.h"
#include "tokenizer/utf8.h"

namespace specinfer {

using json = nlohmann::json;

namespace {

// ---- request parsing helpers -------------------------------------------------------------------

// Every string we write is valid UTF-8 already; `replace` guarantees dump() never throws anyway.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

ApiError WrongType(const std::string& param, const char* expected, const json& got) {
  return ApiError::Invalid(param + " must be " + expected + ", not " + TypeName(got), param);
}

// The value of `key` unless absent or null.
const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// Integral JSON number (an integer, or a float with no fraction) as int64, saturating.
bool ToInt64(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    *out = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return false;
    if (d >= 9.2e18)
      *out = std::numeric_limits<int64_t>::max();
    else if (d <= -9.2e18)
      *out = std::numeric_limits<int64_t>::min();
    else
      *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

int32_t SaturateInt32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

ApiError GetInt(const json& obj, const char* key, std::optional<int64_t>* out) {
  const json* v = Find(obj, key);
  if (!v) return {};
  int64_t x;
  if (!ToInt64(*v, &x)) return WrongType(key, "an integer", *v);
  *out = x;
  return {};
}

ApiError GetFloat(const json& obj, const char* key, float* out) {
  const json* v = Find(obj, key);
  if (!v) return {};
  if (!v->is_number()) return WrongType(key, "a number", *v);
  *out = static_cast<float>(v->get<double>());
  return {};
}

ApiError GetFloat(const json& obj, const char* key, std::optional<float>* out) {
  float v = 0;
  if (!Find(obj, key)) return {};
  if (ApiError e = GetFloat(obj, key, &v); !e.ok()) return e;
  *out = v;
  return {};
}

ApiError GetBool(const json& obj, const char* key, bool* out) {
  const json* v = Find(obj, key);
  if (!v) return {};
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
  *out = v->get<bool>();
  return {};
}

ApiError GetString(const json& obj, const char* key, std::string* out) {
  const json* v = Find(obj, key);
  if (!v) return {};
  if (!v->is_string()) return WrongType(key, "a string", *v);
  *out = v->get<std::string>();
  return {};
}

ApiError Unsupported(const std::string& param, const std::string& what) {
  return ApiError::Invalid(what + " is not supported by this server", param);
}

// Largest nesting depth of arrays/objects in JSON text (strings skipped), to refuse bodies that
// would make the recursive parser run out of stack.
int JsonDepth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}')
      --depth;
  }
  return max_depth;
}

// Byte offset of the first ill-formed UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int n = Utf8Classify(s.substr(i));
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

ApiError ParseTokenArray(const json& arr, const std::string& param, std::vector<int32_t>* out) {
  out->clear();
  for (const json& t : arr) {
    int64_t id;
    if (!ToInt64(t, &id))
      return ApiError::Invalid(param + " token ids must be integers, not " + TypeName(t), param);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      return ApiError::Invalid("token id " + std::to_string(id) + " is out of range", param);
    out->push_back(static_cast<int32_t>(id));
  }
  return {};
}

ApiError ParsePrompt(const json& body, CompletionRequest* out) {
  const json* p = Find(body, "prompt");
  if (!p) return ApiError::Invalid("prompt is required", "prompt");
  const char* kShape =
      "a string, an array of strings, an array of token ids or an array of token-id arrays";
  if (p->is_string()) {
    out->prompts.push_back(PromptInput{false, p->get<std::string>(), {}});
    return {};
  }
  if (!p->is_array()) return WrongType("prompt", kShape, *p);
  if (p->empty()) return ApiError::Invalid("prompt must not be an empty array", "prompt");
  const json& first = p->front();
  if (first.is_number()) {
    PromptInput in{true, "", {}};
    if (ApiError e = ParseTokenArray(*p, "prompt", &in.tokens); !e.ok()) return e;
    out->prompts.push_back(std::move(in));
    return {};
  }
  for (const json& item : *p) {
    if (item.is_string()) {
      out->prompts.push_back(PromptInput{false, item.get<std::string>(), {}});
    } else if (item.is_array()) {
      PromptInput in{true, "", {}};
      if (ApiError e = ParseTokenArray(item, "prompt", &in.tokens); !e.ok()) return e;
      out->prompts.push_back(std::move(in));
    } else {
      return WrongType("prompt", kShape, *p);
    }
    if (out->prompts.size() > static_cast<size_t>(RequestLimits::kMaxSequences))
      return ApiError::Invalid(
          "at most " + std::to_string(RequestLimits::kMaxSequences) + " prompts per request",
          "prompt");
  }
  return {};
}

ApiError ParseMessages(const json& body, CompletionRequest* out) {
  const json* m = Find(body, "messages");
  if (!m) return ApiError::Invalid("messages is required", "messages");
  if (!m->is_array()) return WrongType("messages", "an array", *m);
  if (m->empty()) return ApiError::Invalid("messages must not be empty", "messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return WrongType(param, "an object", msg);
    const json* role = Find(msg, "role");
    if (!role) return ApiError::Invalid(param + ".role is required", param + ".role");
    if (!role->is_string()) return WrongType(param + ".role", "a string", *role);
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r == "tool" || r == "function") return Unsupported(param + ".role", "role '" + r + "'");
    if (r != "system" && r != "user" && r != "assistant")
      return ApiError::Invalid(param + ".role must be system, user or assistant", param + ".role");
    if (const json* tc = Find(msg, "tool_calls"); tc && !(tc->is_array() && tc->empty()))
      return Unsupported(param + ".tool_calls", "tool_calls");
    if (Find(msg, "function_call")) return Unsupported(param + ".function_call", "function_call");
    std::string content;
    const json* c = Find(msg, "content");
    if (!c) {
      if (r != "assistant")
        return ApiError::Invalid(param + ".content is required", param + ".content");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      // Content parts: only text, joined with newlines (as vLLM does).
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pp = param + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return WrongType(pp, "an object", part);
        const json* type = Find(part, "type");
        if (!type || !type->is_string())
          return ApiError::Invalid(pp + ".type must be a string", pp + ".type");
        if (type->get<std::string>() != "text")
          return Unsupported(pp + ".type", "content part type '" + type->get<std::string>() + "'");
        const json* text = Find(part, "text");
        if (!text || !text->is_string())
          return ApiError::Invalid(pp + ".text must be a string", pp + ".text");
        if (k > 0) content += "\n";
        content += text->get<std::string>();
      }
    } else {
      return WrongType(param + ".content", "a string or an array of content parts", *c);
    }
    out->messages.push_back(ChatMessage{std::move(r), std::move(content)});
  }
  return {};
}

ApiError ParseSpeculation(const json& body, SpeculationRequest* out) {
  const json* s = Find(body, "speculation");
  if (!s) return {};
  if (!s->is_object()) return WrongType("speculation", "an object", *s);
  for (const auto& [key, value] : s->items()) {
    if (key != "enabled" && key != "draft" && key != "tree")
      return ApiError::Invalid(
          "unknown field speculation." + key.substr(0, 64) + " (expected enabled, draft, tree)",
          "speculation." + key.substr(0, 64));
  }
  if (const json* e = Find(*s, "enabled")) {
    if (!e->is_boolean()) return WrongType("speculation.enabled", "a boolean", *e);
    out->enabled = e->get<bool>();
  }
  if (const json* d = Find(*s, "draft")) {
    if (!d->is_array()) return WrongType("speculation.draft", "an array of strings", *d);
    for (size_t i = 0; i < d->size(); ++i) {
      const std::string param = "speculation.draft[" + std::to_string(i) + "]";
      if (!(*d)[i].is_string()) return WrongType(param, "a string", (*d)[i]);
      auto spec = ParseDraftSpec((*d)[i].get<std::string>(), kServingLimits);
      if (!spec.ok()) return ApiError::FromStatus(spec.status(), param);
      out->drafts.push_back(std::move(spec).value());
    }
  }
  if (const json* t = Find(*s, "tree")) {
    if (!t->is_array()) return WrongType("speculation.tree", "an array of integers", *t);
    for (size_t i = 0; i < t->size(); ++i) {
      int64_t w;
      if (!ToInt64((*t)[i], &w))
        return WrongType("speculation.tree[" + std::to_string(i) + "]", "an integer", (*t)[i]);
      out->tree.push_back(SaturateInt32(w));
    }
  }
  return {};
}

// Fields a request may carry: OpenAI's own for the endpoint (implemented, ignored as harmless —
// user, metadata, store, service_tier, parallel_tool_calls, tool_choice — or refused when used,
// see RejectUnsupported) plus this server's extensions (top_k, ignore_eos, speculation). Anything
// else is refused as the OpenAI API does ("Unrecognized request argument supplied"), so a
// misspelt parameter never silently falls back to its default.
ApiError RejectUnknownFields(const json& body, OpenAiEndpoint endpoint) {
  static const std::set<std::string, std::less<>> kCommon = {
      "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
      "seed", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "user",
      "metadata", "store", "service_tier",
      // extensions
      "top_k", "ignore_eos", "speculation"};
  static const std::set<std::string, std::less<>> kCompletions = {"prompt", "echo", "suffix",
                                                                  "best_of"};
  static const std::set<std::string, std::less<>> kChat = {
      "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
      "function_call", "parallel_tool_calls", "response_format"};
  const auto& own = endpoint == OpenAiEndpoint::kChat ? kChat : kCompletions;
  for (const auto& [key, value] : body.items()) {
    if (kCommon.count(key) || own.count(key)) continue;
    return ApiError::Invalid("Unrecognized request argument supplied: " + key, key);
  }
  return {};
}

// Known OpenAI features this server does not implement: refused when actually used.
ApiError RejectUnsupported(const json& body, OpenAiEndpoint endpoint, int32_t n) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    float v = 0;
    if (ApiError e = GetFloat(body, key, &v); !e.ok()) return e;
    if (v != 0) return Unsupported(key, key);
  }
  if (const json* lb = Find(body, "logit_bias")) {
    if (!lb->is_object()) return WrongType("logit_bias", "an object", *lb);
    if (!lb->empty()) return Unsupported("logit_bias", "logit_bias");
  }
  if (endpoint == OpenAiEndpoint::kCompletions) {
    bool echo = false;
    if (ApiError e = GetBool(body, "echo", &echo); !e.ok()) return e;
    if (echo) return Unsupported("echo", "echo");
    std::string suffix;
    if (ApiError e = GetString(body, "suffix", &suffix); !e.ok()) return e;
    if (!suffix.empty()) return Unsupported("suffix", "suffix");
    std::optional<int64_t> best_of;
    if (ApiError e = GetInt(body, "best_of", &best_of); !e.ok()) return e;
    if (best_of && *best_of != n) return Unsupported("best_of", "best_of other than n");
  } else {
    for (const char* key : {"tools", "functions"}) {
      if (const json* t = Find(body, key)) {
        if (!t->is_array()) return WrongType(key, "an array", *t);
        if (!t->empty()) return Unsupported(key, key);
      }
    }
    if (const json* rf = Find(body, "response_format")) {
      if (!rf->is_object()) return WrongType("response_format", "an object", *rf);
      const json* type = Find(*rf, "type");
      if (type && !(type->is_string() && type->get<std::string>() == "text"))
        return Unsupported("response_format", "response_format other than text");
    }
  }
  return {};
}

// ---- response helpers --------------------------------------------------------------------------

std::string FinishReasonText(FinishReason r) { return FinishReasonName(r); }

json BytesArray(std::string_view bytes) {
  json a = json::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}

json UsageJson(int32_t prompt, int32_t completion, int32_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace

// ---- parsing -----------------------------------------------------------------------------------

ApiError ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body,
                            CompletionRequest* out) {
  *out = CompletionRequest();
  out->chat = endpoint == OpenAiEndpoint::kChat;
  if (size_t bad = FirstInvalidUtf8(body); bad != std::string_view::npos)
    return ApiError::Invalid("request body is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  if (JsonDepth(body) > kMaxJsonDepth)
    return ApiError::Invalid("request body nests deeper than " + std::to_string(kMaxJsonDepth) +
                             " levels");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    return ApiError::Invalid(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return ApiError::Invalid("request body must be a JSON object");
  if (ApiError e = RejectUnknownFields(j, endpoint); !e.ok()) return e;

  if (ApiError e = GetString(j, "model", &out->model); !e.ok()) return e;
  if (out->chat) {
    if (ApiError e = ParseMessages(j, out); !e.ok()) return e;
  } else {
    if (ApiError e = ParsePrompt(j, out); !e.ok()) return e;
  }

  if (out->chat) {
    if (ApiError e = GetInt(j, "max_tokens", &out->max_tokens); !e.ok()) return e;
    std::optional<int64_t> mct;
    if (ApiError e = GetInt(j, "max_completion_tokens", &mct); !e.ok()) return e;
    if (mct) out->max_tokens = mct;
  } else {
    if (ApiError e = GetInt(j, "max_tokens", &out->max_tokens); !e.ok()) return e;
    out->default_max_tokens = 16;  // OpenAI's default for completions
  }
  if (ApiError e = GetFloat(j, "temperature", &out->temperature); !e.ok()) return e;
  if (ApiError e = GetFloat(j, "top_p", &out->top_p); !e.ok()) return e;
  std::optional<int64_t> v;
  if (ApiError e = GetInt(j, "top_k", &v); !e.ok()) return e;
  if (v) out->top_k = SaturateInt32(*v);
  v.reset();
  if (ApiError e = GetInt(j, "n", &v); !e.ok()) return e;
  if (v) out->n = SaturateInt32(*v);
  if (const json* seed = Find(j, "seed")) {
    int64_t s;
    if (seed->is_number_unsigned())
      s = static_cast<int64_t>(seed->get<uint64_t>());
    else if (!ToInt64(*seed, &s))
      return WrongType("seed", "an integer", *seed);
    out->seed = s;
  }
  if (const json* stop = Find(j, "stop")) {
    if (stop->is_string()) {
      out->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return WrongType("stop", "a string or an array of strings", *stop);
        out->stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (ApiError e = GetBool(j, "ignore_eos", &out->ignore_eos); !e.ok()) return e;
  if (ApiError e = GetBool(j, "stream", &out->stream); !e.ok()) return e;
  if (const json* so = Find(j, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (const json* iu = Find(*so, "include_usage")) {
      if (!iu->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *iu);
      out->include_usage = iu->get<bool>();
    }
  }

  if (out->chat) {
    bool logprobs = false;
    if (ApiError e = GetBool(j, "logprobs", &logprobs); !e.ok()) return e;
    std::optional<int64_t> top;
    if (ApiError e = GetInt(j, "top_logprobs", &top); !e.ok()) return e;
    if (top && !logprobs)
      return ApiError::Invalid("top_logprobs requires logprobs to be true", "top_logprobs");
    if (top && *top < 0)
      return ApiError::Invalid("top_logprobs must be at least 0", "top_logprobs");
    if (logprobs) out->logprobs = top ? SaturateInt32(*top) : 0;
  } else {
    std::optional<int64_t> lp;
    if (ApiError e = GetInt(j, "logprobs", &lp); !e.ok()) return e;
    if (lp && *lp < 0) return ApiError::Invalid("logprobs must be at least 0", "logprobs");
    if (lp) out->logprobs = SaturateInt32(*lp);
  }
  if (ApiError e = ParseSpeculation(j, &out->speculation); !e.ok()) return e;
  return RejectUnsupported(j, endpoint, out->n);
}

std::string OpenAiErrorBody(const ApiError& e) {
  const int status = e.HttpStatus();
  json err = {{"message", e.message},
              {"type", status >= 500 ? "server_error" : "invalid_request_error"},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.error_code.empty() ? json(nullptr) : json(e.error_code)}};
  return Dump(json{{"error", std::move(err)}});
}

namespace {
json ModelJson(const std::string& name, int64_t created, int32_t context) {
  return {{"id", name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "specinfer"},
          {"max_model_len", context}};
}
}  // namespace

std::string OpenAiModelList(const std::string& name, int64_t created, int32_t context) {
  return Dump(json{{"object", "list"}, {"data", json::array({ModelJson(name, created, context)})}});
}

std::string OpenAiModel(const std::string& name, int64_t created, int32_t context) {
  return Dump(ModelJson(name, created, context));
}

// ---- responses ---------------------------------------------------------------------------------

OpenAiResponseWriter::OpenAiResponseWriter(OpenAiEndpoint endpoint, const Tokenizer& tokenizer,
                                           const PreparedRequest& prepared, std::string model,
                                           int32_t logprobs, std::string id, int64_t created)
    : endpoint_(endpoint),
      tokenizer_(tokenizer),
      model_(std::move(model)),
      logprobs_(logprobs),
      id_(std::move(id)),
      created_(created),
      prompt_tokens_(prepared.prompt_tokens),
      choices_per_prompt_(std::max(prepared.choices_per_prompt, 1)),
      choices_(prepared.jobs.size()) {
  for (const SequenceJob& j : prepared.jobs) {
    if (j.index >= 0 && static_cast<size_t>(j.index) < choices_.size() &&
        !j.generate.prompt_tokens.empty())
      choices_[j.index].prev_token = j.generate.prompt_tokens.back();
  }
}

int32_t OpenAiResponseWriter::CachedPromptTokens() const {
  int32_t total = 0;
  for (size_t p = 0; p < choices_.size(); p += choices_per_prompt_) {
    int32_t least = choices_[p].cached_prompt_tokens;
    for (size_t i = p; i < std::min(choices_.size(), p + choices_per_prompt_); ++i)
      least = std::min(least, choices_[i].cached_prompt_tokens);
    total += least;
  }
  return total;
}

RenderedToken OpenAiResponseWriter::RenderOne(int32_t prev, int32_t token, float logprob) const {
  RenderedToken r;
  if (token >= 0 && token < tokenizer_.vocab_size()) {
    r.bytes = tokenizer_.IsSpecial(token) ? std::string(tokenizer_.TokenPiece(token))
                                          : tokenizer_.TokenBytes(prev, token);
  }
  r.text = SanitizeUtf8(r.bytes);
  r.logprob = logprob;
  return r;
}

std::vector<RenderedToken> OpenAiResponseWriter::Render(Choice& choice,
                                                        const StreamEvent& e) const {
  std::vector<RenderedToken> out;
  for (size_t i = 0; i < e.tokens.size(); ++i) {
    const int32_t token = e.tokens[i];
    if (logprobs_ >= 0 && i < e.logprobs.size()) {
      const TokenLogprob& lp = e.logprobs[i];
      RenderedToken r = RenderOne(choice.prev_token, token, lp.logprob);
      r.text_offset = choice.text_offset;
      for (const auto& [id, alt_lp] : lp.top)
        r.top.push_back(RenderOne(choice.prev_token, id, alt_lp));
      out.push_back(std::move(r));
    }
    if (token >= 0 && token < tokenizer_.vocab_size() && !tokenizer_.IsSpecial(token))
      choice.text_offset += static_cast<int64_t>(
          CountCodePoints(SanitizeUtf8(tokenizer_.TokenBytes(choice.prev_token, token))));
    choice.prev_token = token;
  }
  return out;
}

namespace {
// The "logprobs" value for rendered tokens of one choice.
json LogprobsJson(OpenAiEndpoint endpoint, const std::vector<RenderedToken>& tokens) {
  if (endpoint == OpenAiEndpoint::kChat) {
    json content = json::array();
    for (const RenderedToken& t : tokens) {
      json top = json::array();
      for (const RenderedToken& a : t.top)
        top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", BytesArray(a.bytes)}});
      content.push_back({{"token", t.text},
                         {"logprob", t.logprob},
                         {"bytes", BytesArray(t.bytes)},
                         {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const RenderedToken& t : tokens) {
    toks.push_back(t.text);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const RenderedToken& a : t.top)
      if (!top.contains(a.text)) top[a.text] = a.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(t.text_offset);
  }
  return json{{"tokens", std::move(toks)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}
}  // namespace

std::vector<std::string> OpenAiResponseWriter::StreamStart() const {
  std::vector<std::string> out;
  if (endpoint_ != OpenAiEndpoint::kChat) return out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    json chunk = {{"id", id_},
                  {"object", "chat.completion.chunk"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", json::array({{{"index", i},
                                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}})}};
    out.push_back(Dump(chunk));
  }
  return out;
}

std::vector<std::string> OpenAiResponseWriter::StreamChunks(const StreamEvent& e) {
  std::vector<std::string> out;
  if (e.type == StreamEvent::Type::kError || e.index < 0 ||
      static_cast<size_t>(e.index) >= choices_.size())
    return out;
  Choice& choice = choices_[e.index];
  std::vector<RenderedToken> rendered = Render(choice, e);
  const bool finished = e.type == StreamEvent::Type::kFinished;
  if (!finished && e.text.empty() && rendered.empty()) return out;
  json c = {{"index", e.index},
            {"logprobs", rendered.empty() ? json(nullptr) : LogprobsJson(endpoint_, rendered)},
            {"finish_reason", finished ? json(FinishReasonText(e.finish_reason)) : json(nullptr)}};
  if (endpoint_ == OpenAiEndpoint::kChat) {
    c["delta"] = e.text.empty() && finished ? json::object() : json{{"content", e.text}};
  } else {
    c["text"] = e.text;
  }
  if (finished) {
    choice.finish_reason = FinishReasonText(e.finish_reason);
    choice.completion_tokens = e.completion_tokens;
    choice.cached_prompt_tokens = e.cached_prompt_tokens;
  }
  json chunk = {
      {"id", id_},
      {"object", endpoint_ == OpenAiEndpoint::kChat ? "chat.completion.chunk" : "text_completion"},
      {"created", created_},
      {"model", model_},
      {"choices", json::array({std::move(c)})}};
  out.push_back(Dump(chunk));
  return out;
}

std::string OpenAiResponseWriter::UsageChunk() const {
  int32_t completion = 0;
  for (const Choice& c : choices_) completion += c.completion_tokens;
  return Dump(json{
      {"id", id_},
      {"object", endpoint_ == OpenAiEndpoint::kChat ? "chat.completion.chunk" : "text_completion"},
      {"created", created_},
      {"model", model_},
      {"choices", json::array()},
      {"usage", UsageJson(prompt_tokens_, completion, CachedPromptTokens())}});
}

void OpenAiResponseWriter::Add(const StreamEvent& e) {
  if (e.type == StreamEvent::Type::kError || e.index < 0 ||
      static_cast<size_t>(e.index) >= choices_.size())
    return;
  Choice& choice = choices_[e.index];
  std::vector<RenderedToken> rendered = Render(choice, e);
  choice.text += e.text;
  for (RenderedToken& r : rendered) choice.logprobs.push_back(std::move(r));
  if (e.type == StreamEvent::Type::kFinished) {
    choice.finish_reason = FinishReasonText(e.finish_reason);
    choice.completion_tokens = e.completion_tokens;
    choice.cached_prompt_tokens = e.cached_prompt_tokens;
  }
}

std::string OpenAiResponseWriter::Response() const {
  json choices = json::array();
  int32_t completion = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    completion += c.completion_tokens;
    json choice = {
        {"index", i},
        {"logprobs", logprobs_ < 0 ? json(nullptr) : LogprobsJson(endpoint_, c.logprobs)},
        {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
    if (endpoint_ == OpenAiEndpoint::kChat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    choices.push_back(std::move(choice));
  }
  return Dump(
      json{{"id", id_},
           {"object", endpoint_ == OpenAiEndpoint::kChat ? "chat.completion" : "text_completion"},
           {"created", created_},
           {"model", model_},
           {"choices", std::move(choices)},
           {"usage", UsageJson(prompt_tokens_, completion, CachedPromptTokens())}});
}

std::string SseData(std::string_view data) {
  std::string out;
  size_t begin = 0;
  for (;;) {
    size_t end = data.find('\n', begin);
    std::string_view line =
        data.substr(begin, end == std::string_view::npos ? data.npos : end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.append("data: ").append(line).append("\n");
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  out.append("\n");
  return out;
}

}  // namespace specinfer
