#include "spec/token_tree.h"

#include <algorithm>
#include <functional>

namespace specinfer {

TokenTree::TokenTree(int32_t root_token) {
  TreeNode root;
  root.token = root_token;
  root.prob = 1.0f;  // already chosen
  nodes_.push_back(std::move(root));
}

int32_t TokenTree::FindChild(int32_t parent, int32_t token) const {
  for (int32_t c : nodes_[static_cast<size_t>(parent)].children)
    if (nodes_[static_cast<size_t>(c)].token == token) return c;
  return -1;
}

int32_t TokenTree::Propose(int32_t parent, int32_t token, int32_t speculator, int32_t dist,
                           float prob) {
  int32_t child = FindChild(parent, token);
  if (child < 0) {
    child = size();
    TreeNode n;
    n.token = token;
    n.parent = parent;
    n.depth = nodes_[static_cast<size_t>(parent)].depth + 1;
    max_depth_ = std::max(max_depth_, n.depth);
    nodes_.push_back(std::move(n));
    nodes_[static_cast<size_t>(parent)].children.push_back(child);
  }
  TreeNode& c = nodes_[static_cast<size_t>(child)];
  c.proposers |= uint64_t{1} << (speculator % kMaxSpeculators);
  c.prob = std::max(c.prob, prob);
  nodes_[static_cast<size_t>(parent)].trials.push_back({child, speculator, dist});
  return child;
}

void TokenTree::RaiseProb(int32_t node, float prob) {
  float& p = nodes_[static_cast<size_t>(node)].prob;
  p = std::max(p, prob);
}

int32_t TokenTree::AddDistribution(std::vector<float> q) {
  dists_.push_back(std::move(q));
  return static_cast<int32_t>(dists_.size()) - 1;
}

Status TokenTree::Merge(TokenTree&& other) {
  if (other.root_token() != root_token())
    return InvalidArgumentError("cannot merge token trees with different roots");
  const int32_t dist_base = static_cast<int32_t>(dists_.size());
  for (auto& d : other.dists_) dists_.push_back(std::move(d));
  // Parents precede children in node order, so each node's image is known before its children.
  std::vector<int32_t> image(static_cast<size_t>(other.size()), -1);
  image[0] = 0;
  for (int32_t v = 0; v < other.size(); ++v) {
    for (const DraftTrial& t : other.nodes_[static_cast<size_t>(v)].trials) {
      const int32_t child =
          Propose(image[static_cast<size_t>(v)], other.node(t.child).token, t.speculator,
                  t.dist < 0 ? -1 : dist_base + t.dist, other.node(t.child).prob);
      image[static_cast<size_t>(t.child)] = child;
    }
  }
  return Status::Ok();
}

void TokenTree::DepthFirstLayout(std::vector<int32_t>* order,
                                 std::vector<int32_t>* parents) const {
  order->clear();
  parents->clear();
  std::vector<int32_t> layout_of(static_cast<size_t>(size()), -1);
  // Iterative preorder; children pushed in reverse so the first child is laid out first.
  std::vector<int32_t> stack = {0};
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    layout_of[static_cast<size_t>(v)] = static_cast<int32_t>(order->size());
    order->push_back(v);
    const int32_t p = node(v).parent;
    parents->push_back(p < 0 ? -1 : layout_of[static_cast<size_t>(p)]);
    const auto& ch = node(v).children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
}

std::vector<int32_t> TokenTree::TokensTo(int32_t v) const {
  std::vector<int32_t> out;
  for (; v > 0; v = node(v).parent) out.push_back(node(v).token);
  return {out.rbegin(), out.rend()};
}

std::vector<float> TokenTree::SortedProbs() const {
  std::vector<float> out;
  for (size_t v = 1; v < nodes_.size(); ++v) out.push_back(nodes_[v].prob);
  std::sort(out.begin(), out.end(), std::greater<float>());
  return out;
}

std::vector<std::vector<int32_t>> TokenTree::Sequences() const {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> order, parents;
  DepthFirstLayout(&order, &parents);
  for (int32_t v : order)
    if (v != 0 && node(v).children.empty()) out.push_back(TokensTo(v));
  return out;
}

}  // namespace specinfer
