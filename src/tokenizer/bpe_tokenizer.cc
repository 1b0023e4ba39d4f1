// Byte-level BPE: pre-tokenisation with PCRE2, merges with a priority queue. Loading from GGUF
// and tokenizer.json files: bpe_tokenizer_files.cc.
// See bpe_tokenizer.h for the contract and the reference behaviour (Hugging Face tokenizers).

#include "tokenizer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>

#include "tokenizer/utf8.h"

namespace specinfer {
namespace {

// ---- GPT-2 bytes_to_unicode ---------------------------------------------------------------------
// Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other 68 bytes
// map, in byte order, to U+0100, U+0101, ... So every code point is below 256 + 68 = 324.
constexpr uint32_t kByteLevelCodePoints = 324;

struct ByteLevelTables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, kByteLevelCodePoints> cp_to_byte{};
  std::array<std::string, 256> byte_to_utf8;

  ByteLevelTables() {
    cp_to_byte.fill(-1);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 256 + extra++;
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
      std::string& s = byte_to_utf8[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // all below 0x800: two bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables tables;
  return tables;
}

// ---- UTF-8 --------------------------------------------------------------------------------------
inline bool IsCont(uint8_t c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence at p (Unicode Table 3-7: no overlongs, no surrogates,
// nothing above U+10FFFF; exactly what PCRE2 accepts), or 0 if the bytes there are not one.
inline size_t Utf8SeqLen(const uint8_t* p, size_t avail) {
  return ValidUtf8Length(std::string_view(reinterpret_cast<const char*>(p), avail));
}

// Decodes one code point of a well-formed sequence of length n.
inline uint32_t DecodeCp(const uint8_t* p, size_t n) {
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3:
      return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

// The bytes a stored byte-level token stands for. As Hugging Face's ByteLevel decoder does, a
// token with any character outside the byte-level alphabet is taken literally (its UTF-8 bytes).
std::string ByteLevelDecode(std::string_view token) {
  const ByteLevelTables& t = ByteLevel();
  std::string out;
  out.reserve(token.size());
  const auto* p = reinterpret_cast<const uint8_t*>(token.data());
  size_t i = 0;
  while (i < token.size()) {
    const size_t n = Utf8SeqLen(p + i, token.size() - i);
    if (n == 0) return std::string(token);
    const uint32_t cp = DecodeCp(p + i, n);
    if (cp >= kByteLevelCodePoints || t.cp_to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
    i += n;
  }
  return out;
}

// ---- pre-tokenizer regexes (PCRE2 dialect) ------------------------------------------------------
// Hugging Face compiles these with Oniguruma, whose Unicode \s is the White_Space property. With
// PCRE2_UCP, PCRE2's \s is the Z category plus \t\n\v\f\r, which lacks U+0085 (NEL); the patterns
// therefore say [\s\x{85}] wherever the originals say \s, and (?![^\s\x{85}]) for (?!\S). The
// originals, as tokenizer.json spells them, are in bpe_tokenizer_files.cc: change both together.
constexpr const char* kGpt2Pcre =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\x{85}\p{L}\p{N}]+)"
    R"(|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";
constexpr const char* kDigitPcre = R"(\p{N})";
constexpr const char* kLlama3Pcre =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\x{85}\p{L}\p{N}]+[\r\n]*|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";
constexpr const char* kQwen2Pcre =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\x{85}\p{L}\p{N}]+[\r\n]*|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

std::vector<const char*> StagePatterns(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::kGpt2:
      return {kGpt2Pcre};
    case PreTokenizer::kSmolLM:
      return {kDigitPcre, kGpt2Pcre};
    case PreTokenizer::kLlama3:
      return {kLlama3Pcre};
    case PreTokenizer::kQwen2:
      return {kQwen2Pcre};
  }
  return {};
}

std::string Pcre2ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string_view PreTokenizerName(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::kGpt2:
      return "gpt2";
    case PreTokenizer::kSmolLM:
      return "smollm";
    case PreTokenizer::kLlama3:
      return "llama3";
    case PreTokenizer::kQwen2:
      return "qwen2";
  }
  return "?";
}

// ---- BpeTokenizer internals ---------------------------------------------------------------------

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;  // JIT-compiled: pcre2_jit_match skips pcre2_match's per-call checks
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

// Per-Encode working memory, reused across words so that the hot loop does not allocate.
struct BpeTokenizer::Scratch {
  struct Symbol {
    int32_t id;    // token id; -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;     // index of the left symbol
    int32_t left;    // the pair's ids when queued; if the symbols at pos and after it still
    int32_t right;   // hold them, the pair is unchanged (ids only ever grow into longer
    int32_t merged;  // tokens) and `merged` is still its result
    // Min-heap on (rank, pos): lowest rank first, leftmost among equals (as Hugging Face).
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  pcre2_match_data* match = nullptr;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string byte_level;
  // Word -> its ids, for this Encode call only (keys view the caller's text, which outlives the
  // call; nothing is shared between calls or threads). Natural text repeats words a lot.
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;  // (offset, count)
  std::vector<int32_t> cached_ids;
  bool use_cache = false;

  Scratch() : match(pcre2_match_data_create(4, nullptr)) {}
  ~Scratch() {
    if (match != nullptr) pcre2_match_data_free(match);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

void BpeTokenizer::MergeTable::Init(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots.assign(cap, Slot{});
  mask = cap - 1;
}

namespace {
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
inline uint64_t HashKey(uint64_t k) {  // splitmix64 finaliser
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ULL;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebULL;
  k ^= k >> 31;
  return k;
}
}  // namespace

bool BpeTokenizer::MergeTable::Insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  const uint64_t key = PairKey(left, right);
  for (uint64_t i = HashKey(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots[i];
    if (s.key == key) return false;
    if (s.key == ~uint64_t{0}) {
      s = Slot{key, rank, merged};
      return true;
    }
  }
}

const BpeTokenizer::MergeTable::Slot* BpeTokenizer::MergeTable::Find(int32_t left,
                                                                     int32_t right) const {
  const uint64_t key = PairKey(left, right);
  for (uint64_t i = HashKey(key) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots[i];
    if (s.key == key) return &s;
    if (s.key == ~uint64_t{0}) return nullptr;
  }
}

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::ByteLevelEncode(std::string_view bytes) {
  const ByteLevelTables& t = ByteLevel();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += t.byte_to_utf8[c];
  return out;
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpeVocab vocab) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  SI_RETURN_IF_ERROR(tok->Init(std::move(vocab)));
  return tok;
}

Status BpeTokenizer::Init(BpeVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return InvalidArgumentError("BPE vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return InvalidArgumentError("BPE vocabulary too large");
  auto check_id = [n](int32_t id, const char* what) -> Status {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return InvalidArgumentError(std::string(what) + " id " + std::to_string(id) +
                                  " is outside the vocabulary of " + std::to_string(n));
    }
    return Status::Ok();
  };
  SI_RETURN_IF_ERROR(check_id(vocab.bos_id, "BOS"));
  SI_RETURN_IF_ERROR(check_id(vocab.eos_id, "EOS"));
  SI_RETURN_IF_ERROR(check_id(vocab.unk_id, "unk"));

  tokens_ = std::move(vocab.tokens);
  bos_id_ = vocab.bos_id;
  eos_id_ = vocab.eos_id;
  unk_id_ = vocab.unk_id;
  fuse_unk_ = vocab.fuse_unk;
  add_bos_ = vocab.add_bos && bos_id_ >= 0;
  ignore_merges_ = vocab.ignore_merges;
  pre_ = vocab.pre;

  token_to_id_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));

  // Added tokens: the trie for verbatim matching, and what they decode to.
  is_special_.assign(n, 0);
  std::vector<uint8_t> user_defined(n, 0);
  trie_.assign(1, TrieNode{});
  trie_first_.fill(0);
  auto add_to_trie = [this](const std::string& text, int32_t id, bool special) {
    int32_t node = 0;
    for (unsigned char c : text) {
      auto& next = trie_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
      if (it != next.end() && it->first == c) {
        node = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(trie_.size());
        next.insert(it, {c, child});
        trie_.emplace_back();  // invalidates `next`; not used again
        node = child;
      }
    }
    // A text listed twice keeps the first id; a non-special entry wins over a special one, so
    // that it stays matchable without parse_special.
    if (trie_[node].token < 0 || (trie_[node].special && !special)) {
      trie_[node].token = id;
      trie_[node].special = special;
    }
    trie_first_[static_cast<unsigned char>(text[0])] |= special ? 1 : 3;
  };
  for (int32_t id : vocab.special_ids) {
    if (id < 0 || id >= static_cast<int64_t>(n)) {
      return InvalidArgumentError("special token id " + std::to_string(id) + " is out of range");
    }
    is_special_[id] = 1;
    if (!tokens_[id].empty()) {
      add_to_trie(tokens_[id], id, /*special=*/true);
      has_special_ = true;
    }
  }
  for (int32_t id : vocab.user_defined_ids) {
    if (id < 0 || id >= static_cast<int64_t>(n)) {
      return InvalidArgumentError("user-defined token id " + std::to_string(id) +
                                  " is out of range");
    }
    if (is_special_[id]) continue;
    user_defined[id] = 1;
    if (!tokens_[id].empty()) {
      add_to_trie(tokens_[id], id, /*special=*/false);
      has_user_defined_ = true;
    }
  }

  token_bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (is_special_[i]) continue;  // decodes to nothing
    token_bytes_[i] = user_defined[i] ? tokens_[i] : ByteLevelDecode(tokens_[i]);
  }

  const ByteLevelTables& bl = ByteLevel();
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(bl.byte_to_utf8[b]);
    byte_to_id_[b] = it == token_to_id_.end() ? -1 : it->second;
  }

  // Merges: (left, right) -> (rank, merged). A pair listed twice keeps its first (lowest) rank.
  if (vocab.merges.size() > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgumentError("too many merges");
  }
  merges_.Init(vocab.merges.size());
  std::string joined;
  for (size_t r = 0; r < vocab.merges.size(); ++r) {
    const auto& [a, b] = vocab.merges[r];
    auto ia = token_to_id_.find(a);
    auto ib = token_to_id_.find(b);
    joined.assign(a).append(b);
    auto ij = token_to_id_.find(joined);
    if (ia == token_to_id_.end() || ib == token_to_id_.end() || ij == token_to_id_.end()) {
      const std::string& missing =
          ia == token_to_id_.end() ? a : (ib == token_to_id_.end() ? b : joined);
      return InvalidArgumentError("merge " + std::to_string(r) + " (\"" + a + "\" \"" + b +
                                  "\") names \"" + missing + "\", which is not in the vocabulary");
    }
    merges_.Insert(ia->second, ib->second, static_cast<int32_t>(r), ij->second);
  }

  // Pre-tokenizer stages.
  for (const char* pattern : StagePatterns(pre_)) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (re->code == nullptr) {
      return InternalError("pre-tokenizer regex does not compile at offset " +
                           std::to_string(err_off) + ": " + Pcre2ErrorText(err));
    }
    // Without JIT (unsupported platform) pcre2_match interprets: slower, same results.
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    stages_.push_back(std::move(re));
  }
  return Status::Ok();
}

// ---- encoding -----------------------------------------------------------------------------------

// Splits `text` (well-formed UTF-8) by stage `stage`'s regex, Hugging Face "Isolated" style: the
// matches and the stretches between them are words, in order. Each word goes to the next stage;
// after the last stage, to `emit`. Every stage sees its piece as a whole subject, so look-ahead
// stops at the piece's end, as it does in Hugging Face's pre-tokenizer sequence.
template <typename Emit>
Status BpeTokenizer::SplitStage(size_t stage, std::string_view text, Scratch& scratch,
                                Emit& emit) const {
  if (stage == stages_.size()) {
    emit(text);
    return Status::Ok();
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t len = text.size();
  size_t done = 0;    // end of the last emitted word
  size_t search = 0;  // where the next search starts
  while (search < len) {
    const Regex& re = *stages_[stage];
    int rc = re.jit ? pcre2_jit_match(re.code, subject, len, search, 0, scratch.match, nullptr)
                    : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // no JIT, or its stack is too small: interpret
      rc = pcre2_match(re.code, subject, len, search, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       scratch.match, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return InternalError("pre-tokenizer regex failed: " + Pcre2ErrorText(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match);
    const size_t start = ov[0];
    const size_t end = ov[1];
    if (end <= start) {  // empty match (none of our patterns has one): step one character
      search = start + 1;
      while (search < len && IsCont(static_cast<uint8_t>(text[search]))) ++search;
      continue;
    }
    if (start > done) {
      SI_RETURN_IF_ERROR(SplitStage(stage + 1, text.substr(done, start - done), scratch, emit));
    }
    SI_RETURN_IF_ERROR(SplitStage(stage + 1, text.substr(start, end - start), scratch, emit));
    done = search = end;
  }
  if (done < len) SI_RETURN_IF_ERROR(SplitStage(stage + 1, text.substr(done), scratch, emit));
  return Status::Ok();
}

// Cuts `text` into maximal well-formed UTF-8 runs, which go through the regex stages, and single
// bytes of ill-formed sequences, each a word of its own.
template <typename Emit>
Status BpeTokenizer::ForEachWord(std::string_view text, Scratch& scratch, Emit&& emit) const {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t len = text.size();
  size_t run = 0;
  size_t i = 0;
  while (i < len) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t n = Utf8SeqLen(p + i, len - i);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > run) SI_RETURN_IF_ERROR(SplitStage(0, text.substr(run, i - run), scratch, emit));
    emit(text.substr(i, 1));
    run = ++i;
  }
  if (len > run) SI_RETURN_IF_ERROR(SplitStage(0, text.substr(run), scratch, emit));
  return Status::Ok();
}

void BpeTokenizer::EncodeWord(std::string_view word, Scratch& scratch,
                              std::vector<int32_t>* out) const {
  if (word.size() == 1) {  // the common single-byte word
    const int32_t id = byte_to_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out->push_back(id);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
    return;
  }
  if (ignore_merges_) {
    const ByteLevelTables& bl = ByteLevel();
    scratch.byte_level.clear();
    for (unsigned char c : word) scratch.byte_level += bl.byte_to_utf8[c];
    auto it = token_to_id_.find(scratch.byte_level);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }

  // Initial symbols: one per byte. Bytes without a byte-level token are skipped (their
  // neighbours become adjacent) or become unk, as in Hugging Face's BPE::merge_word.
  auto& sym = scratch.symbols;
  sym.clear();
  bool pending_unk = false;
  auto push = [&sym](int32_t id) {
    const int32_t idx = static_cast<int32_t>(sym.size());
    sym.push_back({id, idx - 1, -1});
    if (idx > 0) sym[idx - 1].next = idx;
  };
  for (unsigned char c : word) {
    const int32_t id = byte_to_id_[c];
    if (id >= 0) {
      if (pending_unk) push(unk_id_);
      pending_unk = false;
      push(id);
    } else if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) push(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) push(unk_id_);

  auto& heap = scratch.heap;
  heap.clear();
  auto consider = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0) return;
    if (const MergeTable::Slot* m = merges_.Find(sym[left].id, sym[right].id)) {
      heap.push_back({m->rank, left, sym[left].id, sym[right].id, m->merged});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) {
    if (const MergeTable::Slot* m = merges_.Find(sym[i].id, sym[i + 1].id)) {
      heap.push_back({m->rank, i, sym[i].id, sym[i + 1].id, m->merged});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Scratch::Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = sym[top.pos];
    // Stale if either symbol has merged since (a merged-away symbol has id -1). This is
    // Hugging Face's check (the current pair's merge result must be the queued one) without a
    // hash lookup.
    if (left.id != top.left || left.next < 0 || sym[left.next].id != top.right) continue;
    Scratch::Symbol& right = sym[left.next];
    left.id = top.merged;
    left.next = right.next;
    right.id = -1;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Scratch::Symbol& s : sym) {
    if (s.id >= 0) out->push_back(s.id);
  }
}

Status BpeTokenizer::EncodeSegment(std::string_view text, Scratch& scratch,
                                   std::vector<int32_t>* out) const {
  if (text.empty()) return Status::Ok();
  return ForEachWord(text, scratch, [&](std::string_view word) {
    if (!scratch.use_cache || word.size() < 2) {
      EncodeWord(word, scratch, out);
      return;
    }
    auto [it, inserted] = scratch.cache.try_emplace(word);
    if (!inserted) {
      const auto [offset, count] = it->second;
      out->insert(out->end(), scratch.cached_ids.begin() + offset,
                  scratch.cached_ids.begin() + offset + count);
      return;
    }
    const size_t before = out->size();
    EncodeWord(word, scratch, out);
    it->second = {static_cast<uint32_t>(scratch.cached_ids.size()),
                  static_cast<uint32_t>(out->size() - before)};
    scratch.cached_ids.insert(scratch.cached_ids.end(), out->begin() + before, out->end());
  });
}

namespace {
constexpr size_t kWordCacheMinText = 4096;  // bytes of text
}  // namespace

std::pair<size_t, int32_t> BpeTokenizer::MatchAddedToken(std::string_view text, size_t pos,
                                                         bool parse_special) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    const auto& next = trie_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
    if (it == next.end() || it->first != c) break;
    node = it->second;
    const TrieNode& t = trie_[node];
    if (t.token >= 0 && (parse_special || !t.special)) best = {i + 1 - pos, t.token};
  }
  return best;
}

StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, bool add_bos,
                                                    bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  Scratch scratch;
  if (scratch.match == nullptr) return ResourceExhaustedError("out of memory for regex match");
  // Below a few KB the cache costs more than it saves. Its size is bounded by the text's.
  scratch.use_cache = text.size() >= kWordCacheMinText && text.size() < UINT32_MAX / 2;

  const bool match_added = has_user_defined_ || (parse_special && has_special_);
  const uint8_t first_mask = parse_special ? 1 : 2;
  size_t seg = 0;
  if (match_added) {
    for (size_t i = 0; i < text.size();) {
      if ((trie_first_[static_cast<uint8_t>(text[i])] & first_mask) == 0) {
        ++i;
        continue;
      }
      const auto [len, id] = MatchAddedToken(text, i, parse_special);
      if (len == 0) {
        ++i;
        continue;
      }
      SI_RETURN_IF_ERROR(EncodeSegment(text.substr(seg, i - seg), scratch, &out));
      out.push_back(id);
      i += len;
      seg = i;
    }
  }
  SI_RETURN_IF_ERROR(EncodeSegment(text.substr(seg), scratch, &out));
  return out;
}

StatusOr<std::vector<std::string>> BpeTokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string> words;
  Scratch scratch;
  if (scratch.match == nullptr) return ResourceExhaustedError("out of memory for regex match");
  SI_RETURN_IF_ERROR(
      ForEachWord(text, scratch, [&](std::string_view w) { words.emplace_back(w); }));
  return words;
}

std::string BpeTokenizer::TokenBytes(int32_t /*prev_id*/, int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::string_view BpeTokenizer::TokenPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tokens_[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[id] != 0;
}

int32_t BpeTokenizer::TokenId(std::string_view piece) const {
  auto it = token_to_id_.find(std::string(piece));
  return it == token_to_id_.end() ? -1 : it->second;
}

}  // namespace specinfer
