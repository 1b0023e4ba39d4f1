// Byte-level BPE tokenizer (GPT-2 style), as used by GPT-2, SmolLM/SmolLM2, Llama 3 and Qwen2.
//
// Encoding, for each stretch of text between added tokens:
//   1. pre-tokenisation: the text is split into words by the vocabulary's regex(es) (PCRE2 with
//      Unicode properties, JIT-compiled);
//   2. each word's bytes become byte-level symbols (GPT-2's bytes_to_unicode: every byte has its
//      own printable code point, e.g. ' ' -> 'Ġ'), and adjacent symbols are merged by merge rank,
//      lowest rank first, leftmost first among equal ranks (a priority queue over a linked list
//      of symbols: O(n log n) per word);
//   3. the final symbols are the token ids.
// This reproduces Hugging Face `tokenizers` (BPE model + ByteLevel pre-tokenizer) id for id; see
// tests/reference/make_bpe_vectors.py for the reference vectors.
//
// Added tokens (tokenizer.json "added_tokens", GGUF token types 3 and 4) are matched verbatim in
// the raw text before pre-tokenisation, longest match first, and the text between them is
// encoded on its own (regex look-ahead never crosses an added token):
//   - special (control) tokens such as <|im_start|> only when `parse_special`; otherwise their
//     text is ordinary text;
//   - user-defined (non-special) added tokens always, as Hugging Face and llama.cpp do.
//
// Bytes and invalid UTF-8: every input byte string encodes without error. Invalid UTF-8 cannot
// reach the reference (Hugging Face takes a Python str), so here the text is cut into maximal
// valid UTF-8 runs, which are pre-tokenised normally, and each byte of an invalid sequence becomes
// a word of its own, i.e. its byte-level token. Decoding then restores the exact input bytes.
// A byte whose byte-level symbol is not in the vocabulary (SmolLM2 lacks 21 of the 256, among
// them the control characters 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d) is dropped, exactly as
// Hugging Face's BPE does with unk_token = null (and llama.cpp does); if the vocabulary has an
// unk token, an unknown symbol becomes that token instead.
//
// Decoding (TokenBytes): a normal token yields the raw bytes behind its byte-level string, a
// user-defined added token its text, and a special/control token nothing.
//
// Thread safety: immutable after construction; every method is const and safe to call
// concurrently. No cache is kept (no locking on the encode path).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specinfer/status.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

// The pre-tokenisation rule. The regexes, written in Hugging Face's (Oniguruma) dialect:
//   GPT2   = 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   LLAMA3 = (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   QWEN2  = LLAMA3 with \p{N} in place of \p{N}{1,3}
// \s means Unicode White_Space (it includes U+0085, which PCRE2's \s lacks; the PCRE2 patterns
// spell it out).
enum class PreTokenizer {
  kGpt2,    // ByteLevel(use_regex=true): the GPT2 regex.
  kSmolLM,  // Digits(individual_digits=true) then ByteLevel(use_regex=true): every \p{N} is a word
            // of its own, then the GPT2 regex on each stretch between them (SmolLM, SmolLM2,
            // StarCoder; GGUF pre "smollm").
  kLlama3,  // Split(LLAMA3, Isolated) then ByteLevel(use_regex=false) (Llama 3, 3.1, 3.2).
  kQwen2,   // Split(QWEN2, Isolated) then ByteLevel(use_regex=false) (Qwen2, Qwen2.5).
};

std::string_view PreTokenizerName(PreTokenizer pre);

// A byte-level BPE vocabulary as plain data.
struct BpeVocab {
  // Token strings by id, as stored: byte-level strings for normal tokens ("Ġthe"), the literal
  // text for added tokens ("<|im_start|>").
  std::vector<std::string> tokens;
  // Merge rules in rank order (rank 0 first). Both halves and their concatenation must be tokens.
  std::vector<std::pair<std::string, std::string>> merges;
  // Special/control tokens: matched verbatim only when parse_special; decode to nothing.
  std::vector<int32_t> special_ids;
  // Non-special added tokens: always matched verbatim; decode to their text.
  std::vector<int32_t> user_defined_ids;
  int32_t bos_id = -1;   // -1: none
  int32_t eos_id = -1;   // -1: none
  bool add_bos = false;  // the model's convention (add_bos_by_default)
  // Token for byte-level symbols missing from the vocabulary; -1 drops them (the usual case).
  int32_t unk_id = -1;
  bool fuse_unk = false;  // consecutive unknown symbols become one unk token
  // A word that is itself a token is emitted as that token without merging (Llama 3).
  bool ignore_merges = false;
  PreTokenizer pre = PreTokenizer::kGpt2;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Validates `vocab` (ids in range, merges naming known tokens, ...) and builds the tables.
  // InvalidArgument on inconsistent data.
  static StatusOr<std::unique_ptr<BpeTokenizer>> Create(BpeVocab vocab);

  // Reads a Hugging Face tokenizer.json (model.type "BPE"; merges as "a b" strings or [a, b]
  // arrays; added_tokens; the pre_tokenizer configuration, which must be one that PreTokenizer
  // covers) and, if present beside it, tokenizer_config.json (bos_token, eos_token,
  // add_bos_token). Without that file, BOS comes from a TemplateProcessing post_processor that
  // starts with a special token (Llama 3), else none. Errors: NotFound (no file), DataLoss
  // (malformed JSON, missing or inconsistent fields), Unimplemented (another model type, a
  // normalizer other than NFC, an unsupported pre-tokenizer or option). An NFC normalizer is
  // accepted but not applied: text that is already NFC (nearly all text) encodes identically, and
  // llama.cpp does the same for Qwen2.
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(const std::string& path);
  static StatusOr<BpeVocab> ReadTokenizerJson(const std::string& path);
  // The same from the file contents; `config_json` is tokenizer_config.json's text or empty.
  static StatusOr<BpeVocab> ParseTokenizerJson(std::string_view tokenizer_json,
                                               std::string_view config_json = {});

  // From the GGUF metadata of a tokenizer.ggml.model = "gpt2" vocabulary:
  //   tokens:      tokenizer.ggml.tokens
  //   merges:      tokenizer.ggml.merges, "a b" strings in rank order
  //   token_types: tokenizer.ggml.token_type (1 normal, 2 unknown, 3 control, 4 user-defined,
  //                5 unused, 6 byte), or empty for all normal; 2 and 3 become special tokens, 4
  //                user-defined added tokens, the rest normal tokens
  //   bos_id, eos_id: tokenizer.ggml.bos_token_id / eos_token_id, -1 if absent
  //   add_bos:     tokenizer.ggml.add_bos_token; if absent, true for Llama 3, false otherwise
  //                (llama.cpp's defaults)
  //   pre:         tokenizer.ggml.pre: "gpt2"/"gpt-2"; "smollm"/"starcoder"/"refact";
  //                "llama3"/"llama-v3"/"llama-bpe" (also sets ignore_merges, as llama.cpp does);
  //                "qwen2"/"deepseek-r1-qwen". Others (and a missing key) are Unimplemented.
  // The spans are only read during the call (GgufFile::GetStringArray's views fit directly).
  // Inconsistent data (a merge naming an unknown token, ids out of range) is DataLoss.
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromGgufVocab(
      std::span<const std::string_view> tokens, std::span<const std::string_view> merges,
      std::span<const int32_t> token_types, int32_t bos_id, int32_t eos_id,
      std::optional<bool> add_bos, std::string_view pre);

  // The PreTokenizer (and whether merges are ignored) for a tokenizer.ggml.pre value.
  static StatusOr<std::pair<PreTokenizer, bool>> PreTokenizerFromGgufName(std::string_view pre);

  ~BpeTokenizer() override;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  bool add_bos_by_default() const override { return add_bos_; }

  // Never fails on input text; a non-OK status means an internal regex engine error.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                        bool parse_special = false) const override;
  std::string TokenBytes(int32_t prev_id, int32_t id) const override;
  std::string_view TokenPiece(int32_t id) const override;
  bool IsSpecial(int32_t id) const override;

  PreTokenizer pre_tokenizer() const { return pre_; }
  // Token id of a string exactly as stored (byte-level or added-token text); -1 if none.
  int32_t TokenId(std::string_view piece) const;

  // The pre-tokeniser alone (no added-token split, no BPE): the words of `text`, as raw bytes.
  StatusOr<std::vector<std::string>> PreTokenize(std::string_view text) const;

  // GPT-2's bytes_to_unicode applied to every byte, as UTF-8 ("a b" -> "aĠb").
  static std::string ByteLevelEncode(std::string_view bytes);

 private:
  struct Regex;
  struct Scratch;
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // (byte, child node), sorted by byte
    int32_t token = -1;                             // added token ending here, or -1
    bool special = false;                           // ... and whether it is special
  };
  // Open-addressing table: (left id, right id) -> (rank, merged id).
  struct MergeTable {
    struct Slot {
      uint64_t key = ~uint64_t{0};
      int32_t rank = 0;
      int32_t merged = 0;
    };
    std::vector<Slot> slots;
    uint64_t mask = 0;
    void Init(size_t n);
    bool Insert(int32_t left, int32_t right, int32_t rank, int32_t merged);  // false if present
    const Slot* Find(int32_t left, int32_t right) const;
  };

  BpeTokenizer() = default;
  Status Init(BpeVocab vocab);

  template <typename Emit>
  Status ForEachWord(std::string_view text, Scratch& scratch, Emit&& emit) const;
  template <typename Emit>
  Status SplitStage(size_t stage, std::string_view text, Scratch& scratch, Emit& emit) const;
  Status EncodeSegment(std::string_view text, Scratch& scratch, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, Scratch& scratch, std::vector<int32_t>* out) const;
  // Longest added token at text[pos...]: (length, id), or (0, -1).
  std::pair<size_t, int32_t> MatchAddedToken(std::string_view text, size_t pos,
                                             bool parse_special) const;

  std::vector<std::string> tokens_;
  std::vector<std::string> token_bytes_;  // what each token decodes to
  std::vector<uint8_t> is_special_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::array<int32_t, 256> byte_to_id_{};  // byte -> id of its byte-level symbol, -1 if none
  MergeTable merges_;
  std::vector<std::unique_ptr<Regex>> stages_;  // applied in order, each to the previous' words
  std::vector<TrieNode> trie_;                  // added tokens; node 0 is the root
  std::array<uint8_t, 256> trie_first_{};       // bit 0: some added token starts with this byte;
                                                // bit 1: some non-special one does
  bool has_user_defined_ = false;
  bool has_special_ = false;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool add_bos_ = false;
  bool ignore_merges_ = false;
  PreTokenizer pre_ = PreTokenizer::kGpt2;
};

}  // namespace specinfer
