// Per-request speculation control: the extension field clients use to turn speculative decoding
// on or off and to choose the speculators and the token-tree shape for one request.
//
// Wire forms (both translated into SpeculationRequest by the frontends, openai_api.cc and
// grpc_server.cc, which parse each draft with ParseDraftSpec(..., kServingLimits)):
//   JSON (OpenAI gateway, top-level extension object):
//     "speculation": {"enabled": true, "draft": ["ngram:3", "layers:4", "model:PATH"],
//                     "tree": [1, 1, 3, 1]}
//   gRPC: specinfer.v1.SpeculationParams {enabled, draft, tree}.
//
// The grammar of draft specs and tree shapes and their limits live in spec/spec_grammar.h; what
// clients send is held to the stricter serving policy there (kServingLimits). `tree` is a tree
// shape's widths; empty `draft` / `tree` mean "the server's defaults" (--draft, --tree).
// "model:PATH" is a client-chosen path: the CompletionService accepts only the model drafts the
// server was started with, so no file is loaded on a client's word.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/spec_grammar.h"
#include "specinfer/status.h"

namespace specinfer {

struct SpeculationRequest {
  bool enabled = false;
  std::vector<DraftSpec> drafts;  // empty: the server's default speculators
  std::vector<int32_t> tree;      // expansion widths per depth; empty: the server's default

  int32_t depth() const { return static_cast<int32_t>(tree.size()); }
  // Speculated nodes of the tree (TreeShape::MaxNodes; 0 for an empty tree), saturating at
  // INT32_MAX.
  int32_t num_nodes() const;
};

// Holds a request to kServingLimits: a non-empty tree must be a valid shape (TreeShape::Validate),
// the drafts must pass ValidateDrafts (count, duplicates, and, when `num_layers` > 0, "layers:K"
// with K < num_layers). InvalidArgument naming the offending entry.
Status ValidateSpeculation(const SpeculationRequest& request, int32_t num_layers = 0);

}  // namespace specinfer
