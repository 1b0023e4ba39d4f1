#include "server/output_processor.h"

#include <chrono>
#include <utility>

#include "server/logprobs.h"

namespace specinfer {

namespace {
double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

const char* FinishLabel(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "error";
}

int32_t PromptTokens(const SequenceJob& job) {
  return static_cast<int32_t>(job.generate.prompt_tokens.size());
}
}  // namespace

// ---- SequenceOutput ----------------------------------------------------------------------------

SequenceOutput::SequenceOutput(std::shared_ptr<ResponseStream> stream, const SequenceJob& job,
                               const Tokenizer& tokenizer, ServerMetrics& metrics,
                               bool speculative)
    : stream_(std::move(stream)),
      metrics_(metrics),
      index_(job.index),
      top_logprobs_(job.top_logprobs),
      prompt_tokens_(PromptTokens(job)),
      speculative_(speculative),
      text_(tokenizer, job.generate.prompt_tokens.back(), job.generate.stop_tokens,
            job.stop_strings) {}

bool SequenceOutput::OnToken(int32_t token, std::span<const float> logits) {
  const auto now = ResponseStream::Clock::now();
  if (first_) {
    if (!stream_->first_token_seen_.exchange(true))
      metrics_.ObserveTimeToFirstToken(Seconds(now - stream_->submitted_at()));
    first_ = false;
  } else {
    metrics_.ObserveInterTokenLatency(Seconds(now - last_));
  }
  last_ = now;
  StreamEvent e;
  e.index = index_;
  e.text = text_.Push(token);
  e.tokens = {token};
  if (top_logprobs_ >= 0) e.logprobs = {LogprobsFromLogits(logits, token, top_logprobs_)};
  stream_->Push(std::move(e));
  return !text_.stopped();
}

void SequenceOutput::OnDone(StatusOr<GenerateResult> outcome) {
  if (!outcome.ok()) {
    StreamEvent e;
    e.type = StreamEvent::Type::kError;
    e.index = index_;
    e.error = outcome.status();
    stream_->Push(std::move(e));
    metrics_.CountFinished("error");
    return;
  }
  const GenerateResult& result = *outcome;
  const int32_t generated = static_cast<int32_t>(result.tokens.size());
  metrics_.AddGeneratedTokens(generated);
  if (speculative_) {
    const SpeculationStats& sp = result.stats.spec;
    SpeculationCounters c;
    c.llm_passes = result.stats.decode_passes;
    c.accepted_tokens = sp.accepted_tokens;
    c.draft_seconds = sp.draft_seconds;
    c.accepted_by_depth = sp.accepted_at_depth;
    for (size_t i = 0; i < sp.speculator_names.size(); ++i)
      c.accepted_by_speculator.emplace_back(sp.speculator_names[i], sp.accepted_by[i]);
    metrics_.AddSpeculation(c);
  }
  FinishReason reason = result.finish_reason;
  if (reason == FinishReason::kCancelled && text_.stopped()) reason = FinishReason::kStop;

  StreamEvent done;
  done.type = StreamEvent::Type::kFinished;
  done.index = index_;
  done.text = reason == FinishReason::kCancelled ? std::string() : text_.Finish();
  done.finish_reason = reason;
  done.prompt_tokens = prompt_tokens_;
  done.cached_prompt_tokens = result.stats.cached_prompt_tokens;
  done.completion_tokens = generated;
  stream_->Push(std::move(done));
  metrics_.CountFinished(FinishLabel(reason));
}

// ---- OutputProcessor ---------------------------------------------------------------------------

std::shared_ptr<SequenceOutput> OutputProcessor::Open(std::shared_ptr<ResponseStream> stream,
                                                      const SequenceJob& job,
                                                      bool speculative) const {
  return std::make_shared<SequenceOutput>(std::move(stream), job, tokenizer_, metrics_,
                                          speculative);
}

void OutputProcessor::Cancelled(ResponseStream& stream, const SequenceJob& job) const {
  StreamEvent e;
  e.type = StreamEvent::Type::kFinished;
  e.index = job.index;
  e.finish_reason = FinishReason::kCancelled;
  e.prompt_tokens = PromptTokens(job);
  stream.Push(std::move(e));
  metrics_.CountFinished("cancelled");
}

void OutputProcessor::Failed(ResponseStream& stream, const SequenceJob& job, Status error,
                             bool counted) const {
  StreamEvent e;
  e.type = StreamEvent::Type::kError;
  e.index = job.index;
  e.error = std::move(error);
  stream.Push(std::move(e));
  if (counted) metrics_.CountFinished("error");
}

}  // namespace specinfer
