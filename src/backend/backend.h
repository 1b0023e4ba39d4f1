// The backend interface: a ModelRunner runs forward passes of one model on one device.
//
// A forward pass takes a ForwardBatch: new tokens of one or more sequences, each sequence's new
// tokens attending to the sequence's committed KV entries plus a chosen subset of its own new
// tokens. That subset is given per query row as packed bits, so one description covers every case:
//   - decode:            one new token, mask "sees itself";
//   - causal prefill:    a chain, mask lower-triangular (mask == nullptr means exactly this);
//   - token-tree verify: tree nodes in depth-first order, each row sees its ancestors and itself
//                        (SpecInfer's topology-aware causal mask).
// The K/V of every new token is written to the sequence's slots [kv_prefix + masked_kv,
// kv_end()) (the caller Reserve()s them in the KvCacheManager first); rotary positions come from
// `positions`, which for a tree are prefix + depth, not the layout order.
//
// Implementations: backend/cpu (the reference and fallback) and backend/cuda.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sampling/dist_rows.h"
#include "sampling/sampler.h"
#include "specinfer/status.h"

namespace specinfer {

// Packed attention mask of a sequence's new tokens (rows) over its masked KV window (columns):
// row i, bit j (word j / 64, bit j % 64) set means new token i may attend to window entry j. The
// window is BatchSequence::masked_kv earlier tree entries followed by the new tokens themselves,
// so with masked_kv == 0 columns and rows are the same new tokens.
struct TreeMask {
  int32_t num_tokens = 0;        // rows
  int32_t num_cols = 0;          // columns: masked_kv + num_tokens
  int32_t words_per_row = 0;     // ceil(num_cols / 64)
  std::vector<uint64_t> bits;    // [num_tokens, words_per_row]

  // All bits clear.
  static TreeMask Empty(int32_t rows, int32_t cols);
  static TreeMask Causal(int32_t n);
  // parents[i] is the index of node i's parent among the new tokens, or -1 for a root (which sees
  // only the committed prefix and itself). Requires parents[i] < i (depth-first order).
  static TreeMask FromParents(std::span<const int32_t> parents);
  bool Get(int32_t i, int32_t j) const {
    return (bits[static_cast<size_t>(i) * words_per_row + j / 64] >> (j % 64)) & 1u;
  }
  void Set(int32_t i, int32_t j) {
    bits[static_cast<size_t>(i) * words_per_row + j / 64] |= uint64_t{1} << (j % 64);
  }
};

struct BatchSequence {
  SeqId seq = 0;
  int32_t token_begin = 0;   // index of its first token in ForwardBatch::tokens
  int32_t token_count = 0;
  int32_t kv_prefix = 0;     // committed KV entries every new token sees
  // Entries after the prefix, already in the cache, that a new token sees only where the mask
  // says: the upper levels of a token tree a draft model grows one level per pass. The new
  // tokens go to positions [kv_prefix + masked_kv, kv_prefix + masked_kv + token_count).
  int32_t masked_kv = 0;
  const TreeMask* mask = nullptr;  // nullptr: causal among the new tokens (masked_kv must be 0)

  int32_t kv_end() const { return kv_prefix + masked_kv + token_count; }
};

// A token chosen where the logits are instead of an argmax (ForwardBatch::draws): drawn from the
// distribution ComputeProbs (sampling/sampler.h) gives under these settings, at the uniform `u`
// in [0, 1) the sequence's random stream supplied (SampleFromProbs: the first token, in id order,
// whose cumulative probability exceeds u). Greedy settings (temperature 0, top_k 1): the argmax.
struct TokenDraw {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  double u = 0.0;

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  // `params`' settings (its seed aside) at uniform u, and back.
  static TokenDraw Of(const SamplingParams& params, double u);
  SamplingParams params() const;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;         // [n]
  std::vector<int32_t> positions;      // [n] rotary positions
  std::vector<BatchSequence> seqs;     // tokens grouped per sequence, contiguous, in order
  std::vector<int32_t> logit_rows;     // indices into tokens whose logits are wanted, [m]
  // Indices into tokens whose argmax alone is wanted, [a] (ModelRunner::ForwardArgmax): what a
  // greedy sequence that reads no logits needs, found where the logits are (a GPU, the LLM
  // workers) so that only token ids come back.
  std::vector<int32_t> argmax_rows;
  // Empty (every argmax row an argmax), or one per argmax row: a row whose draw is not greedy
  // comes back as a token drawn from its distribution (ModelRunner::draws_tokens), so that a
  // sampled sequence that reads no logits gets only its token too.
  std::vector<TokenDraw> draws;
  // Indices into tokens whose sampling distribution is wanted, [d] (ModelRunner::ForwardArgmax,
  // into DistRows), with the settings of each (dist_settings[i]; its u is not used): what a
  // sampled token tree's verification reads (multi-step speculative sampling), found where the
  // logits are so that only the tokens each distribution keeps come back, not [d, vocab] logits.
  std::vector<int32_t> dist_rows;
  std::vector<TokenDraw> dist_settings;
  // True: every token's outputs are bit-identical to computing it in any other batch (what
  // decode and tree verification need, so speculative output equals incremental output).
  // False allows faster batch-dependent kernels (BLAS); set it for batches of prompt tokens only.
  bool batch_invariant = true;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  // Appends an argmax row, drawn as `draw` says (filling `draws` with argmaxes first if needed).
  void AddTokenRow(int32_t row, const TokenDraw& draw = {});
  // Whether some argmax row is a sampled draw.
  bool has_draws() const;
  // Appends a distribution row under `settings`.
  void AddDistRow(int32_t row, const TokenDraw& settings);
  // Appends `count` tokens of one sequence.
  void AddSequence(SeqId seq, std::span<const int32_t> toks, std::span<const int32_t> pos,
                   int32_t kv_prefix, const TreeMask* mask, int32_t masked_kv = 0);
  // Checks internal consistency (sizes, ranges, mask dimensions).
  Status Validate(int32_t vocab_size) const;
};

// A row's argmax over some of the vocabulary: its largest logit and that logit's token id.
// Argmax shares of one row over disjoint column ranges combine into the whole row's:
// the largest value, the lowest id among equals (specinfer::Argmax's rule).
struct ArgmaxShare {
  float value = -std::numeric_limits<float>::infinity();
  int32_t id = -1;

  void Combine(const ArgmaxShare& o) {
    if (o.id >= 0 && (id < 0 || o.value > value || (o.value == value && o.id < id))) *this = o;
  }
};

// The argmax shares of a batch's argmax rows over columns [col0, col0 + cols), taken on the host
// from logits that `forward` computes ([rows, cols] for a batch's logit_rows): `forward` runs
// `batch` with its argmax rows, then its distribution rows, appended to its logit rows and no
// argmax or distribution rows left. `logits` receives the logit rows' logits and `argmax` one
// share per argmax row; `scratch` is left holding all of them, [m + a + d, cols] — after the
// logit and argmax rows, the distribution rows' logits, for the caller to turn into
// distributions (this makes none). What runners without a device argmax do.
Status ForwardArgmaxOnHost(
    const ForwardBatch& batch, int32_t col0, int32_t cols, std::vector<float>& scratch,
    std::span<float> logits, std::span<ArgmaxShare> argmax,
    const std::function<Status(const ForwardBatch&, std::span<float>)>& forward);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const Model& model() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"...

  // Runs the batch; writes logits for batch.logit_rows into `logits` ([m, vocab], row-major).
  // Writes K/V of every batch token into the slots `kv` assigns. A batch with argmax rows is
  // refused (InvalidArgument): those go to ForwardArgmax.
  virtual Status Forward(const ForwardBatch& batch, const KvCacheManager& kv,
                         std::span<float> logits) = 0;

  // Forward, and for batch.argmax_rows the index of each row's largest logit (the lowest among
  // equals, as specinfer::Argmax; rows with NaN logits are not supported) into `argmax` ([a]), or
  // for a row that batch.draws samples, the token drawn; for batch.dist_rows their distributions
  // into `dists` (reset to the model's vocabulary; required with distribution rows).
  // The default computes those rows' logits here and takes their argmax (and distributions) on
  // the host; runners whose logits live elsewhere (a GPU, LLM workers) override it to bring back
  // only the ids (and the tokens each distribution keeps).
  virtual Status ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv,
                               std::span<float> logits, std::span<int32_t> argmax,
                               DistRows* dists = nullptr);
  // Whether ForwardArgmax takes ForwardBatch::draws (sampled tokens drawn with the logits: the
  // default draws on the host, a GPU runner on the device). A runner that returns false refuses a
  // batch with sampled draws, and the engine sends it logits rows for its sampled sequences.
  virtual bool draws_tokens() const { return true; }
  // Whether the engine should send a sampled token tree as distribution rows
  // (ForwardBatch::dist_rows) rather than logits rows: true where the logits live away from the
  // host (a GPU), so that only what each distribution keeps comes back. Every runner whose
  // ForwardArgmax is the default takes distribution rows, but on the host they only add work
  // (the verifier computes the distributions of the nodes it visits from logits rows), so the
  // default is false. A runner that does not take them refuses a batch that has them.
  virtual bool returns_distributions() const { return false; }

  // Passes of a new batch shape to run before one shows its steady cost: 2 for a runner that
  // captures a shape's CUDA graph the second time it comes (the third pass is the first replay),
  // 0 for one whose passes cost the same from the first. Cost calibration (the engine core's)
  // runs these untimed before each timed pass.
  virtual int32_t warmup_passes() const { return 0; }

  // Copies the K/V entries of `seq` at positions src[i] to positions dst[i] (all layers), in
  // order. Used to compact an accepted tree path into consecutive positions.
  virtual Status MoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                        std::span<const int32_t> dst) = 0;

  // The KV geometry of this runner's storage: num_kv_blocks() blocks of kv_block_size()
  // positions. The KvCacheManager that drives it must be built with exactly these (the engine
  // and the draft models build theirs from them).
  virtual int32_t num_kv_blocks() const = 0;
  virtual int32_t kv_block_size() const = 0;

  // Changes whenever the K/V this runner held may have been lost (a remote worker restarted or
  // its group failed); 0 for runners whose KV cannot be lost. A sequence that wrote KV under one
  // value must not continue under another (Sequence::CheckKvEpoch).
  virtual uint64_t kv_epoch() const { return 0; }

 private:
  std::vector<float> argmax_scratch_;  // the default ForwardArgmax's logits
  std::vector<float> draw_probs_;      // and a sampled draw's or a distribution row's
  std::vector<ArgmaxShare> argmax_shares_;
};

}  // namespace specinfer
