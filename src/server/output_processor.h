// The output processor: turns what the engine core reports about a sequence (each token with the
// logits row it was chosen from, then the sequence's end) into the StreamEvents of its request's
// ResponseStream, and counts it in the server's metrics.
//
//   engine core ──token, logits──> SequenceOutput::OnToken ──> text delta (server/text_output.h:
//                                                              bytes -> UTF-8 -> stop strings),
//                                                              logprobs (server/logprobs.h)
//               ──outcome───────> SequenceOutput::OnDone  ──> final event (finish reason, usage)
//                                                              or kError
//                                  both ──> ResponseStream (server/request_queue.h), metrics
//
// Tokens are turned into text as they are chosen, so a stop string ends generation at the exact
// token (OnToken returns false); logprobs come from the very logits rows the tokens were chosen
// from, so they stream live too. A sequence cancelled after a stop string appeared finishes as
// kStop: the stop string ended it.
//
// Thread safety: a SequenceOutput is used by one thread at a time (the engine's worker);
// OutputProcessor's methods may be called from any thread (ServerMetrics and ResponseStream are
// thread-safe, the tokenizer is immutable).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "engine/generation.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/request_queue.h"
#include "server/text_output.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

// One running sequence's output.
class SequenceOutput {
 public:
  // `speculative`: the sequence runs with speculators (its speculation statistics are counted).
  SequenceOutput(std::shared_ptr<ResponseStream> stream, const SequenceJob& job,
                 const Tokenizer& tokenizer, ServerMetrics& metrics, bool speculative);

  // A token chosen from `logits` ([vocab]): one kDelta event with its text (possibly empty),
  // the token and, if asked for, its logprobs. False once a stop string has appeared.
  bool OnToken(int32_t token, std::span<const float> logits);
  // The sequence ended: its final event (the text still held back, finish reason, usage), or
  // kError for a failed outcome.
  void OnDone(StatusOr<GenerateResult> outcome);

  ResponseStream& stream() { return *stream_; }

 private:
  const std::shared_ptr<ResponseStream> stream_;
  ServerMetrics& metrics_;
  const int32_t index_;
  const int32_t top_logprobs_;
  const int32_t prompt_tokens_;
  const bool speculative_;
  CompletionText text_;
  bool first_ = true;
  ResponseStream::Clock::time_point last_;  // when the previous token was reported
};

class OutputProcessor {
 public:
  // `tokenizer` and `metrics` must outlive it and the SequenceOutputs it opens.
  OutputProcessor(const Tokenizer& tokenizer, ServerMetrics& metrics)
      : tokenizer_(tokenizer), metrics_(metrics) {}

  // The output of `job`, a sequence of `stream`'s request, about to run.
  std::shared_ptr<SequenceOutput> Open(std::shared_ptr<ResponseStream> stream,
                                       const SequenceJob& job, bool speculative) const;

  // Final events of sequences that end without running: cancelled (kFinished, kCancelled) or
  // failed (kError with `error`). `counted`: whether the metrics count it as finished (queued
  // sequences failed by a shutdown are not).
  void Cancelled(ResponseStream& stream, const SequenceJob& job) const;
  void Failed(ResponseStream& stream, const SequenceJob& job, Status error,
              bool counted = true) const;

 private:
  const Tokenizer& tokenizer_;
  ServerMetrics& metrics_;
};

}  // namespace specinfer
