// The SSM worker protocol's messages (proto/ssm_worker.proto) to and from the engine's types,
// with the validation both ends apply: nothing from the wire is trusted.
//
// Token trees travel as their nodes (token, parent, proposer bits) with each node's trials in
// verification order, and the draft distributions q of sampled proposals sparsely, as their
// nonzero (id, prob) entries (float32, so the round trip is exact). TreeFromProto rebuilds the
// very same TokenTree (node indices, children order, trials, distributions) by replaying the
// proposals in the order that created the nodes, and refuses anything that a real tree could
// not be.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "proto/ssm_worker.pb.h"
#include "sampling/sampler.h"
#include "spec/token_tree.h"
#include "specinfer/status.h"

namespace specinfer {

// Largest number of items in one Speculate call, and of bytes in a session key.
inline constexpr int kMaxSpeculateItems = 1024;
inline constexpr size_t kMaxSessionKeyBytes = 128;

// Writes `tree` into `out` (cleared first). Distributions are sent for every index a trial uses.
void TreeToProto(const TokenTree& tree, worker::TokenTreeProto* out);

// Rebuilds a tree sent by a worker. InvalidArgument naming the problem unless: node 0 is a root
// holding `root_token`; every other node's parent precedes it and its token is in [0, vocab);
// no two children of a node share a token; every trial names a child of its node, a speculator
// in [0, 64) and a distribution that exists (or -1); every node is proposed; the tree is no
// deeper than `max_depth` and holds at most TreeShape::kMaxNodes nodes past the root; each
// distribution's ids are ascending and in the vocabulary, its probabilities finite, positive and
// summing to 1 (within 1e-3), and it gives the token drawn from it a nonzero probability; the
// proposer bits equal those the trials imply.
StatusOr<TokenTree> TreeFromProto(const worker::TokenTreeProto& proto, int32_t vocab,
                                  int32_t root_token, int32_t max_depth);

// The 64-bit seed a sampled Speculate item carries, drawn from the request's random stream (so a
// seeded request stays repeatable). Greedy items need none.
uint64_t DrawSpeculationSeed(Rng& rng);

// The sampling parameters of an item (seed excluded), and back.
void SamplingToProto(const SamplingParams& s, worker::Sampling* out);
SamplingParams SamplingFromProto(const worker::Sampling& s);

// Checks a Speculate item against a worker serving a vocabulary of `vocab` tokens and a
// context of `context` tokens: session key 1..kMaxSessionKeyBytes bytes; tokens in the
// vocabulary; base + tokens within [1, context]; the shape valid (TreeShape::Validate);
// max_depth in [0, TreeShape::kMaxDepth]; sampling valid (SamplingParams::Validate);
// speculator_index in [0, 64). InvalidArgument naming the field otherwise.
Status ValidateSpeculateItem(const worker::SpeculateItem& item, int32_t vocab, int32_t context);

}  // namespace specinfer
