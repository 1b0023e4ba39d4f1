#include "dist/ssm_wire.h"

#include <algorithm>
#include <cmath>

namespace specinfer {

namespace {

Status Malformed(const std::string& what) {
  return InvalidArgumentError("malformed token tree: " + what);
}

}  // namespace

void TreeToProto(const TokenTree& tree, worker::TokenTreeProto* out) {
  out->Clear();
  int32_t num_dists = 0;
  for (int32_t v = 0; v < tree.size(); ++v) {
    const TreeNode& n = tree.node(v);
    worker::TreeNodeProto* p = out->add_nodes();
    p->set_token(n.token);
    p->set_parent(n.parent);
    p->set_proposers(n.proposers);
    for (const DraftTrial& t : n.trials) {
      worker::Trial* tp = p->add_trials();
      tp->set_child(t.child);
      tp->set_speculator(t.speculator);
      tp->set_dist(t.dist);
      num_dists = std::max(num_dists, t.dist + 1);
    }
  }
  for (int32_t d = 0; d < num_dists; ++d) {
    const std::span<const float> q = tree.distribution(d);
    worker::SparseDistribution* sd = out->add_dists();
    for (size_t i = 0; i < q.size(); ++i) {
      if (q[i] == 0.0f) continue;
      sd->add_ids(static_cast<int32_t>(i));
      sd->add_probs(q[i]);
    }
  }
}

StatusOr<TokenTree> TreeFromProto(const worker::TokenTreeProto& proto, int32_t vocab,
                                  int32_t root_token, int32_t max_depth) {
  const int n = proto.nodes_size();
  if (n < 1) return Malformed("no root");
  if (n > TreeShape::kMaxNodes + 1)
    return Malformed(std::to_string(n) + " nodes (at most " +
                     std::to_string(TreeShape::kMaxNodes + 1) + ")");
  const auto& root = proto.nodes(0);
  if (root.parent() != -1) return Malformed("node 0 has a parent");
  if (root.token() != root_token)
    return Malformed("root token " + std::to_string(root.token()) + ", expected " +
                     std::to_string(root_token));
  std::vector<int32_t> depth(static_cast<size_t>(n), 0);
  for (int v = 1; v < n; ++v) {
    const auto& node = proto.nodes(v);
    if (node.parent() < 0 || node.parent() >= v)
      return Malformed("node " + std::to_string(v) + " has parent " +
                       std::to_string(node.parent()) + " (parents precede children)");
    if (node.token() < 0 || node.token() >= vocab)
      return Malformed("node " + std::to_string(v) + " token " + std::to_string(node.token()) +
                       " outside the vocabulary of " + std::to_string(vocab));
    depth[static_cast<size_t>(v)] = depth[static_cast<size_t>(node.parent())] + 1;
    if (depth[static_cast<size_t>(v)] > max_depth)
      return Malformed("node " + std::to_string(v) + " at depth " +
                       std::to_string(depth[static_cast<size_t>(v)]) + " beyond " +
                       std::to_string(max_depth));
  }

  // Distributions, dense.
  const int num_dists = proto.dists_size();
  if (num_dists > n) return Malformed("more distributions than nodes");
  std::vector<std::vector<float>> dists(static_cast<size_t>(num_dists));
  for (int d = 0; d < num_dists; ++d) {
    const auto& sd = proto.dists(d);
    if (sd.ids_size() != sd.probs_size() || sd.ids_size() == 0)
      return Malformed("distribution " + std::to_string(d) + " has " +
                       std::to_string(sd.ids_size()) + " ids and " +
                       std::to_string(sd.probs_size()) + " probabilities");
    std::vector<float>& q = dists[static_cast<size_t>(d)];
    q.assign(static_cast<size_t>(vocab), 0.0f);
    double sum = 0;
    int32_t prev = -1;
    for (int i = 0; i < sd.ids_size(); ++i) {
      const int32_t id = sd.ids(i);
      const float p = sd.probs(i);
      if (id <= prev || id >= vocab)
        return Malformed("distribution " + std::to_string(d) + ": id " + std::to_string(id) +
                         " not ascending or outside the vocabulary");
      if (!std::isfinite(p) || p <= 0.0f || p > 1.0f)
        return Malformed("distribution " + std::to_string(d) + ": probability " +
                         std::to_string(p) + " of id " + std::to_string(id));
      q[static_cast<size_t>(id)] = p;
      sum += p;
      prev = id;
    }
    if (std::fabs(sum - 1.0) > 1e-3)
      return Malformed("distribution " + std::to_string(d) + " sums to " + std::to_string(sum));
  }

  // Trials refer to children of their node, existing distributions, valid speculators.
  for (int v = 0; v < n; ++v) {
    for (const auto& t : proto.nodes(v).trials()) {
      if (t.child() <= 0 || t.child() >= n || proto.nodes(t.child()).parent() != v)
        return Malformed("node " + std::to_string(v) + " has a trial of node " +
                         std::to_string(t.child()) + ", not its child");
      if (t.speculator() < 0 || t.speculator() >= TokenTree::kMaxSpeculators)
        return Malformed("speculator " + std::to_string(t.speculator()));
      if (t.dist() < -1 || t.dist() >= num_dists)
        return Malformed("trial names distribution " + std::to_string(t.dist()) + " of " +
                         std::to_string(num_dists));
      if (t.dist() >= 0 &&
          dists[static_cast<size_t>(t.dist())][static_cast<size_t>(proto.nodes(t.child()).token())] <=
              0.0f)
        return Malformed("a sampled token has probability 0 in its distribution");
    }
  }

  // Replay: node v is created by the first trial of its parent that names it; the parent's
  // trials before that one name children created earlier.
  TokenTree tree(root_token);
  for (auto& q : dists) tree.AddDistribution(std::move(q));
  std::vector<int> cursor(static_cast<size_t>(n), 0);
  auto replay = [&](int p) -> StatusOr<int32_t> {
    const auto& t = proto.nodes(p).trials(cursor[static_cast<size_t>(p)]++);
    const int32_t got = tree.Propose(p, proto.nodes(t.child()).token(), t.speculator(), t.dist());
    if (got != t.child())
      return Malformed("node " + std::to_string(t.child()) + " is out of proposal order");
    return got;
  };
  for (int v = 1; v < n; ++v) {
    const int p = proto.nodes(v).parent();
    for (;;) {
      if (cursor[static_cast<size_t>(p)] >= proto.nodes(p).trials_size())
        return Malformed("node " + std::to_string(v) + " is never proposed");
      SI_ASSIGN_OR_RETURN(int32_t got, replay(p));
      if (got == v) break;
    }
  }
  for (int p = 0; p < n; ++p)
    while (cursor[static_cast<size_t>(p)] < proto.nodes(p).trials_size()) {
      SI_RETURN_IF_ERROR(replay(p).status());
    }
  for (int v = 0; v < n; ++v)
    if (tree.node(v).proposers != proto.nodes(v).proposers())
      return Malformed("node " + std::to_string(v) + " proposer bits disagree with its trials");
  return tree;
}

uint64_t DrawSpeculationSeed(Rng& rng) {
  // Two draws: 53 random bits and 11 more.
  const uint64_t hi = static_cast<uint64_t>(rng.Uniform() * 9007199254740992.0);
  const uint64_t lo = static_cast<uint64_t>(rng.Uniform() * 2048.0);
  return (hi << 11) | lo;
}

void SamplingToProto(const SamplingParams& s, worker::Sampling* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
}

SamplingParams SamplingFromProto(const worker::Sampling& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  return p;
}

Status ValidateSpeculateItem(const worker::SpeculateItem& item, int32_t vocab, int32_t context) {
  if (item.session().empty() || item.session().size() > kMaxSessionKeyBytes)
    return InvalidArgumentError("session key of " + std::to_string(item.session().size()) +
                                " bytes (1 to " + std::to_string(kMaxSessionKeyBytes) + ")");
  const int64_t total = static_cast<int64_t>(item.base()) + item.tokens_size();
  if (total < 1 || total > context)
    return InvalidArgumentError("sequence of " + std::to_string(total) +
                                " tokens (1 to the context of " + std::to_string(context) + ")");
  for (int32_t t : item.tokens())
    if (t < 0 || t >= vocab)
      return InvalidArgumentError("token " + std::to_string(t) + " outside the vocabulary of " +
                                  std::to_string(vocab));
  TreeShape shape;
  if (item.widths_size() > TreeShape::kMaxDepth)
    return InvalidArgumentError("tree shape deeper than " + std::to_string(TreeShape::kMaxDepth));
  shape.widths.assign(item.widths().begin(), item.widths().end());
  SI_RETURN_IF_ERROR(shape.Validate());
  if (item.max_depth() < 0 || item.max_depth() > TreeShape::kMaxDepth)
    return InvalidArgumentError("max_depth " + std::to_string(item.max_depth()));
  SI_RETURN_IF_ERROR(SamplingFromProto(item.sampling()).Validate());
  if (item.speculator_index() < 0 || item.speculator_index() >= TokenTree::kMaxSpeculators)
    return InvalidArgumentError("speculator_index " + std::to_string(item.speculator_index()));
  return Status::Ok();
}

}  // namespace specinfer
