#include "spec/dynamic_tree.h"

#include <algorithm>
#include <numeric>
#include <queue>

namespace specinfer {

namespace {

// What the growth keeps of a node the draft has run.
struct Expandable {
  int32_t node = 0;
  std::vector<float> q;       // the draft's distribution there (ranking, and draws when sampled)
  int32_t dist = -1;          // its index in the tree (sampled requests)
  std::vector<int32_t> top;   // tokens by q, highest first (lower id first among equals)
  int32_t next = 0;           // greedy: index in `top` of the next token to propose
  int32_t trials = 0;         // proposals made at this node
};

// A pending proposal at an expandable node, by priority.
struct Slot {
  float priority;
  int32_t order;  // creation order: earlier first among equals
  int32_t index;  // into the expandables
  bool operator<(const Slot& o) const {
    return priority != o.priority ? priority < o.priority : order > o.order;
  }
};

}  // namespace

StatusOr<TokenTree> GrowDynamicTree(int32_t root_token, std::span<const float> root_logits,
                                    const DynamicTreeOptions& o, const SamplingParams& sampling,
                                    Rng& rng, int32_t speculator, const DraftRunFn& run) {
  TokenTree tree(root_token);
  if (o.max_nodes <= 0 || o.max_depth <= 0 || o.max_children <= 0) return tree;
  const int32_t vocab = static_cast<int32_t>(root_logits.size());
  const bool greedy = sampling.greedy();
  // Greedy requests rank by the draft's own softmax (the request's temperature when it has one);
  // sampled requests by the very distribution they draw from.
  SamplingParams rank = sampling;
  if (greedy) {
    rank.temperature = sampling.temperature > 0 ? sampling.temperature : 1.0f;
    rank.top_k = 0;
    rank.top_p = 1.0f;
  }
  const int32_t rounds = o.max_rounds > 0 ? o.max_rounds : o.max_depth;
  const int32_t top_n = std::min(o.max_children + 1, vocab);

  std::vector<Expandable> ex;
  std::priority_queue<Slot> heap;
  int32_t slot_order = 0;
  // The priority of v's next proposal: c(v) times the largest q of a token v has no child for.
  auto push_slot = [&](int32_t i) {
    Expandable& e = ex[static_cast<size_t>(i)];
    if (e.trials >= o.max_children) return;
    float best = 0;
    if (greedy) {
      if (e.next < static_cast<int32_t>(e.top.size()))
        best = e.q[static_cast<size_t>(e.top[static_cast<size_t>(e.next)])];
    } else {
      for (int32_t t : e.top)
        if (tree.FindChild(e.node, t) < 0) {
          best = e.q[static_cast<size_t>(t)];
          break;
        }
    }
    if (best <= 0) return;
    heap.push(Slot{tree.node(e.node).prob * best, slot_order++, i});
  };
  auto add_expandable = [&](int32_t node, std::span<const float> logits) {
    Expandable e;
    e.node = node;
    ComputeProbs(logits, rank, e.q);
    e.top.resize(static_cast<size_t>(vocab));
    std::iota(e.top.begin(), e.top.end(), 0);
    std::partial_sort(e.top.begin(), e.top.begin() + top_n, e.top.end(), [&](int32_t a, int32_t b) {
      const float qa = e.q[static_cast<size_t>(a)], qb = e.q[static_cast<size_t>(b)];
      return qa > qb || (qa == qb && a < b);
    });
    e.top.resize(static_cast<size_t>(top_n));
    ex.push_back(std::move(e));
    push_slot(static_cast<int32_t>(ex.size()) - 1);
  };

  add_expandable(0, root_logits);
  std::vector<int32_t> fresh;
  std::vector<float> logits;
  for (int32_t round = 0; round < rounds && !heap.empty(); ++round) {
    fresh.clear();
    // An even share of what is left for the rounds left (a round that could not use its share,
    // e.g. the first, whose nodes can only be the root's children, leaves it to the next).
    const int32_t left = o.max_nodes - (tree.size() - 1);
    const int32_t per_round = (left + (rounds - round) - 1) / (rounds - round);
    int32_t added = 0;
    while (!heap.empty() && added < per_round && tree.size() - 1 < o.max_nodes) {
      const Slot s = heap.top();
      if (s.priority < o.min_prob) {
        while (!heap.empty()) heap.pop();
        break;
      }
      heap.pop();
      Expandable& e = ex[static_cast<size_t>(s.index)];
      int32_t token;
      if (greedy) {
        token = e.top[static_cast<size_t>(e.next++)];
      } else {
        if (e.dist < 0) e.dist = tree.AddDistribution(e.q);
        token = SampleFromProbs(e.q, rng);
      }
      ++e.trials;
      const float prob = tree.node(e.node).prob * e.q[static_cast<size_t>(token)];
      const int32_t before = tree.size();
      const int32_t child = tree.Propose(e.node, token, speculator, greedy ? -1 : e.dist, prob);
      if (tree.size() > before) {
        ++added;
        if (tree.node(child).depth < o.max_depth) fresh.push_back(child);
      }
      push_slot(s.index);
    }
    // The new nodes' own children come next round: run them (not after the last round, nor
    // when the budget is spent).
    if (fresh.empty() || round + 1 == rounds || tree.size() - 1 >= o.max_nodes) {
      if (tree.size() - 1 >= o.max_nodes) break;
      continue;
    }
    SI_RETURN_IF_ERROR(run(tree, fresh, logits));
    if (logits.size() < fresh.size() * static_cast<size_t>(vocab))
      return InternalError("draft returned fewer logits rows than nodes");
    for (size_t f = 0; f < fresh.size(); ++f)
      add_expandable(fresh[f], std::span<const float>(logits).subspan(f * vocab, vocab));
  }
  return tree;
}

}  // namespace specinfer
