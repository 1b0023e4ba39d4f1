// The grammar of speculation settings, written once: draft specs (which speculators propose) and
// tree shapes (how far and how wide they guess), with the limits beside them.
//
// Draft specs name speculators (spec/speculator.h builds them):
//   "ngram[:N]"   prompt lookup: continue an earlier occurrence of the last N..1 tokens
//                 (1 <= N <= max_ngram; bare "ngram": the lookup's default, kDefaultMaxNgram)
//   "layers:K"    self-speculation with the model's first K layers (1 <= K < model layers; the
//                 layer count is checked against a model by CheckDraftFitsModel)
//   "model:PATH"  a small draft model loaded from PATH
// Tree shapes are SpecInfer's expansion configuration <k1, ..., km>, written "1,1,3,1": at depth
// d every frontier node gets (up to) k_d children, so 1,1,3,1 grows a chain of two, then three
// branches, each extended by one: 1 + 1 + 3 + 3 = 8 speculated nodes per verification pass.
//
// Limits: kEngineLimits is what the engine can run (its KV reserve per sequence is sized by
// kEngineLimits.max_tree_nodes, a token tree records at most max_drafts proposers); every parser
// and validator here takes them by default. kServingLimits is the stricter policy the servers
// (HTTP, gRPC) apply to what clients send, so one request cannot ask for a pass the size of
// several; CLI flags and cluster configs, written by the operator, get the engine's limits.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

struct SpeculationLimits {
  int32_t max_tree_width = 0;   // children per node at one depth (widths 1..max_tree_width)
  int32_t max_tree_depth = 0;   // entries of a tree shape
  int64_t max_tree_nodes = 0;   // speculated nodes of a full expansion, root excluded
  int32_t max_drafts = 0;       // speculators of one request
  int32_t max_ngram = 0;        // N of "ngram:N"
  int32_t max_path_bytes = 0;   // PATH of "model:PATH"
  bool path_whitespace = true;  // whether PATH may hold spaces (never control characters)
};

inline constexpr SpeculationLimits kEngineLimits{.max_tree_width = 16,
                                                 .max_tree_depth = 32,
                                                 .max_tree_nodes = 512,
                                                 .max_drafts = 64,
                                                 .max_ngram = 16,
                                                 .max_path_bytes = 4096,
                                                 .path_whitespace = true};
inline constexpr SpeculationLimits kServingLimits{.max_tree_width = 16,
                                                  .max_tree_depth = 16,
                                                  .max_tree_nodes = 128,
                                                  .max_drafts = 8,
                                                  .max_ngram = 16,
                                                  .max_path_bytes = 4096,
                                                  .path_whitespace = false};

// The default tree shape (SpecInfer's example expansion) of the CLI, the servers and clusters.
inline constexpr std::string_view kDefaultTreeShape = "1,1,3,1,1,1,1,1";

// N of a bare "ngram": the lookup tries the last 3, 2, then 1 tokens.
inline constexpr int32_t kDefaultMaxNgram = 3;

struct DraftSpec {
  enum class Kind { kNgram, kLayers, kModel };
  Kind kind = Kind::kNgram;
  int32_t n = 0;           // kNgram: n-gram length (0: bare "ngram"); kLayers: leading layers
  std::string model_path;  // kModel only

  // The n-gram length a kNgram spec runs with (kDefaultMaxNgram for a bare "ngram").
  int32_t ngram() const { return n == 0 ? kDefaultMaxNgram : n; }
  // The canonical text form ("ngram:3", "ngram", "layers:4", "model:PATH").
  std::string ToString() const;
  friend bool operator==(const DraftSpec&, const DraftSpec&) = default;
};

// Parses one draft spec. InvalidArgument naming the spec and the problem for anything else: an
// unknown kind ("unknown draft ..."), a missing or non-decimal number (no sign, no spaces), N out
// of range, an empty or too long path, control characters anywhere, whitespace outside a path,
// and whitespace in a path where `limits` forbid it.
StatusOr<DraftSpec> ParseDraftSpec(std::string_view spec,
                                   const SpeculationLimits& limits = kEngineLimits);

// "layers:K" must leave at least one layer of a model with `num_layers` layers out (K <
// num_layers); other kinds always fit. InvalidArgument naming the spec otherwise.
Status CheckDraftFitsModel(const DraftSpec& draft, int32_t num_layers);

// The drafts of one request: at most limits.max_drafts, none twice, and, when `num_layers` > 0,
// each fits the model (CheckDraftFitsModel). InvalidArgument naming the offending spec.
Status ValidateDrafts(std::span<const DraftSpec> drafts, const SpeculationLimits& limits,
                      int32_t num_layers = 0);

// Static expansion configuration <k1, ..., km>: at step i every frontier node gets (up to) k_i
// children. Depth m is the longest sequence a speculator may guess.
struct TreeShape {
  std::vector<int32_t> widths;

  // The engine's limits (kEngineLimits), for code that sizes buffers by them.
  static constexpr int32_t kMaxWidth = kEngineLimits.max_tree_width;
  static constexpr int32_t kMaxDepth = kEngineLimits.max_tree_depth;
  static constexpr int64_t kMaxNodes = kEngineLimits.max_tree_nodes;

  int32_t depth() const { return static_cast<int32_t>(widths.size()); }
  // Nodes a full expansion of this shape holds, root excluded (sum of the prefix products;
  // widths below 0 count as 0). Stops growing past 2^40, far beyond any limit.
  int64_t MaxNodes() const;
  // InvalidArgument for an empty shape, a depth over limits.max_tree_depth, a width outside
  // [1, limits.max_tree_width] (naming its entry) or more than limits.max_tree_nodes nodes.
  Status Validate(const SpeculationLimits& limits = kEngineLimits) const;
  std::string ToString() const;  // "1,1,3,1"

  // Parses "1,1,3,1" (commas, optional spaces) and validates it against `limits`.
  static StatusOr<TreeShape> Parse(std::string_view text,
                                   const SpeculationLimits& limits = kEngineLimits);
  // kDefaultTreeShape.
  static TreeShape Default();
  // The shape of a single chain of `depth` tokens.
  static TreeShape Chain(int32_t depth) { return TreeShape{std::vector<int32_t>(depth, 1)}; }
};

}  // namespace specinfer
