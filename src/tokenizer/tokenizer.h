// The tokenizer interface shared by every vocabulary format (llama2.c tokenizer.bin,
// SentencePiece-style BPE from GGUF, byte-level BPE from tokenizer.json or GGUF).
//
// Thread safety: a Tokenizer is immutable after construction; all methods are const and may be
// called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if the vocabulary has none
  virtual int32_t eos_id() const = 0;  // -1 if the vocabulary has none
  // Whether the model expects BOS before a prompt (the model's own convention).
  virtual bool add_bos_by_default() const = 0;

  // Encodes `text` into ids, prepending BOS when `add_bos` (and the vocabulary has one).
  // Special-token text such as "<|im_start|>" is matched as a special token only when
  // `parse_special`; otherwise it is ordinary text. Arbitrary bytes (invalid UTF-8 too) must
  // encode without error where the vocabulary has byte tokens or byte fallback.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                                bool parse_special = false) const = 0;

  // The bytes token `id` contributes to output text when it follows `prev_id` (-1 at the start).
  // Knowing the previous token lets SentencePiece-style vocabularies drop the dummy-prefix space
  // after BOS. Special/control tokens (BOS, EOS) contribute nothing. The bytes may be part of a
  // UTF-8 character; use Utf8StreamDecoder to assemble text.
  virtual std::string TokenBytes(int32_t prev_id, int32_t id) const = 0;

  // The vocabulary entry as stored (for debugging and logprob display).
  virtual std::string_view TokenPiece(int32_t id) const = 0;

  // Whether `id` is a control/special token (BOS, EOS, chat markers...).
  virtual bool IsSpecial(int32_t id) const = 0;

  // Decodes a whole id sequence to bytes (concatenated TokenBytes, prev starting at -1).
  std::string Decode(std::span<const int32_t> ids) const;
};

// A 64-bit FNV-1a hash over the vocabulary size, the BOS and EOS ids (each as a little-endian
// int64) and every token's piece (TokenPiece) in id order, each piece prefixed by its length as an
// int64 (so "ab","c" and "a","bc" differ). Two tokenizers with equal fingerprints map ids to the
// same text. What cluster workers compare at registration, and what a draft model made by
// scripts/boost_tune.py carries (GGUF `specinfer.vocab_fingerprint`) instead of a tokenizer.
uint64_t VocabFingerprint(const Tokenizer& tokenizer);

// Assembles streamed token bytes into text that never ends in half a UTF-8 character.
// Bytes that can never become valid UTF-8 are replaced by U+FFFD, as decoders conventionally do.
class Utf8StreamDecoder {
 public:
  // Appends bytes; returns the longest prefix of the pending bytes that forms complete
  // characters. An incomplete trailing sequence is held back for the next call.
  std::string Push(std::string_view bytes);
  // Returns whatever is held back (as U+FFFD for an incomplete sequence) and resets.
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace specinfer
