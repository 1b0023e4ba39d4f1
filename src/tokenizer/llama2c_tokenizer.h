// SentencePiece-style BPE tokenizer: llama2.c's tokenizer.bin, and any vocabulary of scored
// pieces with byte fallback (GGUF "llama" vocabularies can build one with FromVocab).
//
// Encoding is llama2.c's (run.c) algorithm, which for the Llama 2 vocabulary gives the same ids
// as SentencePiece (tests/tokenizer/llama2c_tokenizer_test.cc checks this against ids produced by
// the sentencepiece library itself):
//   1. BOS first when asked.
//   2. If the text is non-empty, a dummy prefix " " is put before it (only if " " is a piece and
//      SpecialIds::add_space_prefix).
//   3. The text is split into UTF-8 code points; a byte that is not part of a complete, valid
//      sequence (invalid lead, stray continuation, overlong, surrogate, > U+10FFFF, truncated)
//      is a unit of its own. Each unit whose bytes are a piece becomes that piece; any other unit
//      becomes its bytes' byte-fallback tokens "<0xHH>" (or one <unk> if some byte has none).
//   4. Repeatedly, the adjacent pair of units whose concatenation is a piece with the highest
//      score is merged (the leftmost pair on equal scores), until no pair merges. Byte-fallback
//      tokens never merge, and only normal and user-defined pieces are merge results or units:
//      <unk>, control tokens (<s>, </s>) and "<0xHH>" pieces are never matched from text.
// This runs in O(n log n) with a priority queue over adjacent pairs and a linked list of units
// (as SentencePiece's BPE does); the result equals the naive rule above. Where run.c is looser
// (it groups invalid UTF-8 by continuation bytes, assumes byte tokens at ids 3..258, and could in
// principle merge into a "<0xHH>" or control piece) this follows SentencePiece instead; the
// ids differ from run.c's only for such inputs or vocabularies. For invalid UTF-8, SentencePiece
// itself substitutes U+FFFD where this keeps the bytes (see the test data's "excluded" list).
//
// Pieces are stored with ' ' for the space (llama2.c's export replaces SentencePiece's U+2581).
//
// Special tokens in text: with parse_special, the text of each control token, i.e. its piece
// without surrounding '\n' and ' ' ("<s>", "</s>" for llama2.c's "\n<s>\n", "\n</s>\n"), maps to
// that token (leftmost occurrence first, the longest on a tie). The text between them is encoded
// as above, each non-empty fragment with its own dummy prefix (as llama.cpp does). Without
// parse_special such text is ordinary text.
//
// Decoding (TokenBytes): control tokens contribute nothing; <unk> is " ⁇ " (SentencePiece's
// unk_surface, U+2047); "<0xHH>" is the raw byte; any other piece is itself, except that ONE
// leading ' ' is dropped when the previous id is BOS or -1 (start of text): that space is the
// dummy prefix (a vocabulary without a " " piece has no dummy prefix and drops nothing). Hence
// Decode(Encode(s, add_bos)) == s for every byte string s when parse_special is false and the
// vocabulary has all 256 byte tokens.
//
// Thread safety: immutable after construction; every method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specinfer/status.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

class Llama2cTokenizer final : public Tokenizer {
 public:
  // Kinds of token, numbered as SentencePiece's ModelProto.SentencePiece.Type and GGUF's
  // tokenizer.ggml.token_type.
  enum class TokenType : uint8_t {
    kNormal = 1,
    kUnknown = 2,      // <unk>
    kControl = 3,      // <s>, </s>, chat markers: special, decode to nothing
    kUserDefined = 4,  // treated as kNormal (SentencePiece would match them before BPE)
    kUnused = 5,       // never produced by Encode; decodes as its piece
    kByte = 6,         // "<0xHH>": byte fallback, decodes to the raw byte
  };

  // -1 where the vocabulary has no such token.
  struct SpecialIds {
    int32_t unk_id = 0;
    int32_t bos_id = 1;
    int32_t eos_id = 2;
    // False: no dummy prefix even when " " is a piece (GGUF tokenizer.ggml.add_space_prefix =
    // false, as in Gemma's vocabulary).
    bool add_space_prefix = true;
  };

  // Largest piece length Load accepts (llama2.c's max_token_length is 27 for Llama 2).
  static constexpr int32_t kMaxPieceBytes = 1 << 16;

  // Reads llama2.c's tokenizer.bin: int32 max_token_length, then per token a float32 score,
  // an int32 byte length and the bytes. Ids 0, 1, 2 are <unk>, <s>, </s>; "<0xHH>" pieces are
  // byte tokens wherever they are. Errors (messages name `path`): NotFound/Unavailable from
  // opening; DataLoss for a truncated file, a negative or absurd length, a non-finite score;
  // InvalidArgument if the file holds a number of tokens other than `expected_vocab_size` (the
  // model's vocab_size) or that is not positive.
  static StatusOr<std::unique_ptr<Llama2cTokenizer>> Load(const std::string& path,
                                                          int32_t expected_vocab_size);

  // Builds a tokenizer from plain data. `pieces` use ' ' for the space (convert U+2581 first);
  // `scores` (finite) are the merge priorities, one per piece. `types`, if empty, is derived:
  // ids.unk_id -> kUnknown, ids.bos_id and ids.eos_id -> kControl, pieces "<0xHH>" -> kByte,
  // all else kNormal. A kByte piece that is not "<0xHH>" is InvalidArgument, as are mismatched
  // sizes, an empty vocabulary, out-of-range special ids. If two eligible pieces are equal, the
  // lower id is used.
  static StatusOr<std::unique_ptr<Llama2cTokenizer>> FromVocab(std::vector<std::string> pieces,
                                                               std::vector<float> scores,
                                                               SpecialIds ids,
                                                               std::vector<TokenType> types = {});

  Llama2cTokenizer(const Llama2cTokenizer&) = delete;
  Llama2cTokenizer& operator=(const Llama2cTokenizer&) = delete;

  // Tokenizer:
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return ids_.bos_id; }
  int32_t eos_id() const override { return ids_.eos_id; }
  bool add_bos_by_default() const override { return true; }
  // InvalidArgument only if some byte needs a fallback token and the vocabulary has neither the
  // byte token nor <unk>, or the text is 2 GiB or larger.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos,
                                        bool parse_special = false) const override;
  // Empty for an id out of range.
  std::string TokenBytes(int32_t prev_id, int32_t id) const override;
  std::string_view TokenPiece(int32_t id) const override;
  // True for control tokens (BOS, EOS...); <unk> is not special (it displays as " ⁇ ").
  bool IsSpecial(int32_t id) const override;

  int32_t unk_id() const { return ids_.unk_id; }
  // kNormal for an id out of range.
  TokenType token_type(int32_t id) const;
  // The merge score of `id` (0 for an id out of range).
  float score(int32_t id) const;
  // The id of the byte-fallback token for byte `b`, or -1.
  int32_t byte_token(uint8_t b) const { return byte_token_[b]; }

 private:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                   std::vector<TokenType> types, SpecialIds ids);

  // Appends the ids of one text fragment (dummy prefix, code points, merges) to `out`.
  Status EncodeFragment(std::string_view text, std::vector<int32_t>* out) const;
  // The id of a piece that text may produce (normal or user-defined), or -1.
  int32_t Lookup(std::string_view piece) const;

  std::vector<std::string> pieces_;  // [vocab_size]
  std::vector<float> scores_;        // [vocab_size]
  std::vector<TokenType> types_;     // [vocab_size]
  SpecialIds ids_;
  int32_t byte_token_[256];       // byte -> id of "<0xHH>", or -1
  std::vector<int16_t> byte_of_;  // [vocab_size] id -> byte value of a kByte token, or -1
  // Pieces eligible for encoding (kNormal, kUserDefined), keyed by views into pieces_.
  std::unordered_map<std::string_view, int32_t> piece_to_id_;
  size_t max_piece_bytes_ = 0;     // longest key of piece_to_id_
  bool has_dummy_prefix_ = false;  // " " is a piece: Encode prefixes it, TokenBytes drops it
  // Text of each control token for parse_special, e.g. {"<s>", 1}.
  std::vector<std::pair<std::string, int32_t>> special_texts_;
};

}  // namespace specinfer
