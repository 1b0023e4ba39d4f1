// Per-request speculation control: the extension field clients use to turn speculative decoding
// on or off and to choose the speculators and the token-tree shape for one request.
//
// Wire forms (both parsed into SpeculationRequest by the frontends):
//   JSON (OpenAI gateway, top-level extension object):
//     "speculation": {"enabled": true, "draft": ["ngram:3", "layers:4", "model:PATH"],
//                     "tree": [1, 1, 3, 1]}
//   gRPC: specinfer.v1.SpeculationParams {enabled, draft, tree}.
//
// Draft specs name the speculators (the syntax of spec/speculator.h, so DraftSpec::ToString() is
// what Engine::GetSpeculator takes) that propose candidate tokens:
//   "ngram[:N]"   prompt lookup: continue an earlier occurrence of the last N tokens (1..16;
//                 bare "ngram": the speculator's default)
//   "layers:N"    self-speculation with the model's first N layers (1 <= N < model layers)
//   "model:PATH"  a small draft model loaded from PATH (which the server must allow; see below)
// `tree` is SpecInfer's expansion configuration: entry d is how many children every node at
// depth d gets (top-k of the speculator's distribution), so [1, 1, 3, 1] grows a chain of two,
// then three branches, each extended by one: 1 + 1 + 3 + 3 = 8 speculated nodes per pass.
// Empty `draft` / `tree` mean "the server's defaults".
//
// This file only parses and validates; it knows nothing about how speculation runs. The
// generator takes a validated SpeculationRequest as is. Note for the wiring: "model:PATH" is a
// client-chosen path, so the server must check it against the draft models it was started with
// (never load arbitrary files on a client's word).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

struct DraftSpec {
  enum class Kind { kNgram, kLayers, kModel };
  Kind kind = Kind::kNgram;
  int32_t n = 0;           // kNgram: n-gram length (0: default); kLayers: leading layers
  std::string model_path;  // kModel only

  // The canonical text form ("ngram:3", "ngram", "layers:4", "model:PATH").
  std::string ToString() const;
  friend bool operator==(const DraftSpec&, const DraftSpec&) = default;
};

struct SpeculationRequest {
  static constexpr int32_t kMaxTreeWidth = 16;   // children per node at one depth
  static constexpr int32_t kMaxTreeDepth = 16;   // entries in `tree`
  static constexpr int32_t kMaxTreeNodes = 128;  // speculated nodes per verification pass
  static constexpr int32_t kMaxDrafts = 8;
  static constexpr int32_t kMaxNgram = 16;

  bool enabled = false;
  std::vector<DraftSpec> drafts;  // empty: the server's default speculators
  std::vector<int32_t> tree;      // expansion widths per depth; empty: the server's default

  int32_t depth() const { return static_cast<int32_t>(tree.size()); }
  // Speculated nodes of the tree: sum over depths d of prod_{i <= d} tree[i] (0 for an empty
  // tree). Saturates at INT32_MAX.
  int32_t num_nodes() const;
};

// Parses one draft spec string ("ngram", "ngram:3", "layers:4", "model:PATH"). InvalidArgument
// naming the problem for anything else (unknown kind, missing or non-decimal number, out-of-range
// N, empty path, whitespace or control characters).
StatusOr<DraftSpec> ParseDraftSpec(std::string_view spec);

// Checks the tree (widths 1..kMaxTreeWidth, depth <= kMaxTreeDepth, nodes <= kMaxTreeNodes), the
// number of drafts, duplicates, and, when `num_layers` > 0, that "layers:N" leaves at least one
// layer out (N < num_layers). InvalidArgument naming the offending entry.
Status ValidateSpeculation(const SpeculationRequest& request, int32_t num_layers = 0);

}  // namespace specinfer
