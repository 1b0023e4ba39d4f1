#include "tokenizer/llama2c_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>

#include "common/mapped_file.h"
#include "tokenizer/utf8.h"

namespace specinfer {
namespace {

// SentencePiece's unk_surface: " ⁇ " (U+2047).
constexpr std::string_view kUnkSurface = " \xE2\x81\x87 ";

// The byte value of a "<0xHH>" piece, or -1.
int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(piece[3]), lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A unit of text during BPE: a byte range of the fragment, linked to its live neighbours.
struct Symbol {
  uint32_t start;
  uint32_t len;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
  int32_t id;  // the piece, or -1 for a unit to be byte-fallen-back (never merges)
};

// A candidate merge of two adjacent symbols into piece `id`.
struct Candidate {
  float score;
  uint32_t left_start;  // tie-break: leftmost first
  int32_t left;
  int32_t right;
  uint32_t len;  // left.len + right.len when queued; a mismatch later means it is stale
  int32_t id;
};

struct CandidateOrder {
  // std::priority_queue pops the largest: highest score, then smallest start.
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left_start > b.left_start;
  }
};

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                                   std::vector<TokenType> types, SpecialIds ids)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      types_(std::move(types)),
      ids_(ids),
      byte_of_(pieces_.size(), -1) {
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  piece_to_id_.reserve(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& piece = pieces_[i];
    switch (types_[i]) {
      case TokenType::kByte: {
        const int b = ParseBytePiece(piece);  // validated by FromVocab
        byte_of_[i] = static_cast<int16_t>(b);
        if (byte_token_[b] < 0) byte_token_[b] = id;
        break;
      }
      case TokenType::kNormal:
      case TokenType::kUserDefined:
        if (!piece.empty() && piece_to_id_.emplace(piece, id).second) {
          max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
        }
        break;
      case TokenType::kControl: {
        const size_t first = piece.find_first_not_of("\n ");
        if (first == std::string::npos) break;
        const size_t last = piece.find_last_not_of("\n ");
        special_texts_.emplace_back(piece.substr(first, last - first + 1), id);
        break;
      }
      case TokenType::kUnknown:
      case TokenType::kUnused:
        break;
    }
  }
  has_dummy_prefix_ = ids_.add_space_prefix && Lookup(" ") >= 0;
}

StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::FromVocab(
    std::vector<std::string> pieces, std::vector<float> scores, SpecialIds ids,
    std::vector<TokenType> types) {
  const size_t n = pieces.size();
  if (n == 0) return InvalidArgumentError("tokenizer vocabulary is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgumentError("tokenizer vocabulary is too large");
  }
  if (scores.size() != n) {
    return InvalidArgumentError("tokenizer vocabulary has " + std::to_string(n) + " pieces but " +
                                std::to_string(scores.size()) + " scores");
  }
  if (!types.empty() && types.size() != n) {
    return InvalidArgumentError("tokenizer vocabulary has " + std::to_string(n) + " pieces but " +
                                std::to_string(types.size()) + " token types");
  }
  const std::pair<const char*, int32_t> special[] = {
      {"unk", ids.unk_id}, {"bos", ids.bos_id}, {"eos", ids.eos_id}};
  for (const auto& [name, id] : special) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return InvalidArgumentError(std::string("tokenizer ") + name + " id " + std::to_string(id) +
                                  " is outside the vocabulary of " + std::to_string(n));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(scores[i])) {
      return InvalidArgumentError("tokenizer score of token " + std::to_string(i) +
                                  " is not finite");
    }
  }
  if (types.empty()) {
    types.assign(n, TokenType::kNormal);
    for (size_t i = 0; i < n; ++i) {
      if (ParseBytePiece(pieces[i]) >= 0) types[i] = TokenType::kByte;
    }
    if (ids.bos_id >= 0) types[ids.bos_id] = TokenType::kControl;
    if (ids.eos_id >= 0) types[ids.eos_id] = TokenType::kControl;
    if (ids.unk_id >= 0) types[ids.unk_id] = TokenType::kUnknown;
  } else {
    for (size_t i = 0; i < n; ++i) {
      const auto t = static_cast<int>(types[i]);
      if (t < static_cast<int>(TokenType::kNormal) || t > static_cast<int>(TokenType::kByte)) {
        return InvalidArgumentError("token " + std::to_string(i) + " has unknown type " +
                                    std::to_string(t));
      }
      if (types[i] == TokenType::kByte && ParseBytePiece(pieces[i]) < 0) {
        return InvalidArgumentError("byte token " + std::to_string(i) + " is not of the form " +
                                    "<0xHH>");
      }
    }
  }
  return std::unique_ptr<Llama2cTokenizer>(
      new Llama2cTokenizer(std::move(pieces), std::move(scores), std::move(types), ids));
}

StatusOr<std::unique_ptr<Llama2cTokenizer>> Llama2cTokenizer::Load(const std::string& path,
                                                                   int32_t expected_vocab_size) {
  const std::string what = "tokenizer file '" + path + "'";
  if (expected_vocab_size < 3) {  // llama2.c's fixed ids 0, 1, 2 must exist
    return InvalidArgumentError(what + ": the model's vocab_size " +
                                std::to_string(expected_vocab_size) + " is too small");
  }
  SI_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  ByteReader reader(file->data(), file->size(), what);
  int32_t max_len = 0;
  SI_RETURN_IF_ERROR(reader.Read(&max_len));
  if (max_len <= 0 || max_len > kMaxPieceBytes) {
    return DataLossError(what + ": max_token_length " + std::to_string(max_len) +
                         " is outside 1.." + std::to_string(kMaxPieceBytes));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  pieces.reserve(expected_vocab_size);
  scores.reserve(expected_vocab_size);
  // Read every token the file holds, to report a count mismatch with the real count.
  while (reader.remaining() > 0) {
    const std::string token = "token " + std::to_string(pieces.size());
    float score = 0;
    int32_t len = 0;
    Status s = reader.Read(&score);
    if (s.ok()) s = reader.Read(&len);
    if (!s.ok()) return s.WithContext(token);
    if (len < 0 || len > max_len) {
      return DataLossError(what + ": " + token + " has length " + std::to_string(len) +
                           " (max_token_length is " + std::to_string(max_len) + ")");
    }
    if (!std::isfinite(score)) {
      return DataLossError(what + ": " + token + " has a non-finite score");
    }
    StatusOr<const uint8_t*> bytes = reader.Take(static_cast<size_t>(len));
    if (!bytes.ok()) return bytes.status().WithContext(token);
    pieces.emplace_back(reinterpret_cast<const char*>(*bytes), static_cast<size_t>(len));
    scores.push_back(score);
  }
  if (pieces.size() != static_cast<size_t>(expected_vocab_size)) {
    return InvalidArgumentError(what + " holds " + std::to_string(pieces.size()) +
                                " tokens but the model's vocab_size is " +
                                std::to_string(expected_vocab_size) +
                                " (a tokenizer for another model, or a truncated file)");
  }
  auto tokenizer = FromVocab(std::move(pieces), std::move(scores), SpecialIds{});
  if (!tokenizer.ok()) return tokenizer.status().WithContext(what);
  return tokenizer;
}

int32_t Llama2cTokenizer::Lookup(std::string_view piece) const {
  if (piece.size() > max_piece_bytes_) return -1;
  const auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

StatusOr<std::vector<int32_t>> Llama2cTokenizer::Encode(std::string_view text, bool add_bos,
                                                        bool parse_special) const {
  if (text.size() >= (size_t{1} << 31)) {
    return InvalidArgumentError("text of " + std::to_string(text.size()) +
                                " bytes is too long to tokenize");
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && ids_.bos_id >= 0) out.push_back(ids_.bos_id);
  if (!parse_special || special_texts_.empty()) {
    SI_RETURN_IF_ERROR(EncodeFragment(text, &out));
    return out;
  }
  // next[i]: the first occurrence of special_texts_[i] at or after `pos` (or npos), refreshed
  // only once `pos` has passed it, so the scan stays linear for a handful of specials.
  constexpr size_t kNone = std::string_view::npos;
  std::vector<size_t> next(special_texts_.size());
  for (size_t i = 0; i < special_texts_.size(); ++i) next[i] = text.find(special_texts_[i].first);
  size_t pos = 0;
  while (true) {
    size_t best = kNone;
    size_t best_len = 0;
    int32_t best_id = -1;
    for (size_t i = 0; i < special_texts_.size(); ++i) {
      const std::string& s = special_texts_[i].first;
      if (next[i] != kNone && next[i] < pos) next[i] = text.find(s, pos);
      if (next[i] == kNone) continue;
      if (next[i] < best || (next[i] == best && s.size() > best_len)) {
        best = next[i];
        best_len = s.size();
        best_id = special_texts_[i].second;
      }
    }
    if (best == kNone) break;
    SI_RETURN_IF_ERROR(EncodeFragment(text.substr(pos, best - pos), &out));
    out.push_back(best_id);
    pos = best + best_len;
  }
  SI_RETURN_IF_ERROR(EncodeFragment(text.substr(pos), &out));
  return out;
}

Status Llama2cTokenizer::EncodeFragment(std::string_view fragment,
                                        std::vector<int32_t>* out) const {
  if (fragment.empty()) return Status::Ok();
  std::string text;
  text.reserve(fragment.size() + 1);
  if (has_dummy_prefix_) text.push_back(' ');
  text.append(fragment);
  const std::string_view view(text);

  // Units: valid code points, or single bytes.
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len = ValidUtf8Length(view.substr(i));
    if (len == 0) len = 1;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{static_cast<uint32_t>(i), static_cast<uint32_t>(len), index - 1,
                             index + 1, Lookup(view.substr(i, len))});
    i += len;
  }
  symbols.back().next = -1;

  std::vector<Candidate> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue(CandidateOrder{},
                                                                               std::move(storage));
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    if (l.id < 0 || r.id < 0) return;  // byte fallback never merges
    const uint32_t len = l.len + r.len;
    const int32_t id = Lookup(view.substr(l.start, len));
    if (id < 0) return;
    queue.push(Candidate{scores_[id], l.start, left, right, len, id});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    Symbol& r = symbols[c.right];
    // Stale if either side was merged away or grew since (lengths only grow, starts never move).
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
    l.len = c.len;
    l.id = c.id;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    try_pair(l.prev, c.left);
    try_pair(c.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out->push_back(s.id);
      continue;
    }
    bool all_bytes = true;
    for (uint32_t k = 0; k < s.len; ++k) {
      all_bytes = all_bytes && byte_token_[static_cast<uint8_t>(text[s.start + k])] >= 0;
    }
    if (all_bytes) {
      for (uint32_t k = 0; k < s.len; ++k) {
        out->push_back(byte_token_[static_cast<uint8_t>(text[s.start + k])]);
      }
    } else if (ids_.unk_id >= 0) {
      out->push_back(ids_.unk_id);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<uint8_t>(text[s.start]));
      return InvalidArgumentError(std::string("cannot tokenize the character starting with byte ") +
                                  hex + ": the vocabulary has neither its byte tokens nor <unk>");
    }
  }
  return Status::Ok();
}

std::string Llama2cTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  switch (types_[id]) {
    case TokenType::kControl:
      return "";
    case TokenType::kUnknown:
      return std::string(kUnkSurface);
    case TokenType::kByte:
      return std::string(1, static_cast<char>(byte_of_[id]));
    default:
      break;
  }
  std::string_view piece = pieces_[id];
  // Drop the dummy prefix: one leading space of the first piece of a text.
  if (has_dummy_prefix_ && (prev_id == -1 || (prev_id == ids_.bos_id && prev_id >= 0)) &&
      !piece.empty() && piece[0] == ' ') {
    piece.remove_prefix(1);
  }
  return std::string(piece);
}

std::string_view Llama2cTokenizer::TokenPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

bool Llama2cTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && types_[id] == TokenType::kControl;
}

Llama2cTokenizer::TokenType Llama2cTokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kNormal;
  return types_[id];
}

float Llama2cTokenizer::score(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return 0.0f;
  return scores_[id];
}

}  // namespace specinfer
