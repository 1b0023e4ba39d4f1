#include "server/speculation.h"

#include <algorithm>
#include <charconv>
#include <limits>

namespace specinfer {

namespace {

// A decimal integer of 1..9 digits, nothing else (no sign, no spaces).
bool ParseSmallDecimal(std::string_view s, int32_t* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

std::string DraftSpec::ToString() const {
  switch (kind) {
    case Kind::kNgram:
      return n == 0 ? "ngram" : "ngram:" + std::to_string(n);
    case Kind::kLayers:
      return "layers:" + std::to_string(n);
    case Kind::kModel:
      return "model:" + model_path;
  }
  return "";
}

int32_t SpeculationRequest::num_nodes() const {
  int64_t total = 0, level = 1;
  for (int32_t w : tree) {
    level *= std::max<int64_t>(w, 0);
    total += level;
    if (total > std::numeric_limits<int32_t>::max() || level > std::numeric_limits<int32_t>::max())
      return std::numeric_limits<int32_t>::max();
  }
  return static_cast<int32_t>(total);
}

StatusOr<DraftSpec> ParseDraftSpec(std::string_view spec) {
  const std::string quoted =
      "draft spec '" + std::string(spec.substr(0, 64)) + (spec.size() > 64 ? "...'" : "'");
  for (unsigned char c : spec) {
    if (c <= 0x20 || c == 0x7f)
      return InvalidArgumentError(quoted + " contains whitespace or control characters");
  }
  if (spec == "ngram") return DraftSpec{DraftSpec::Kind::kNgram, 0, ""};
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos)
    return InvalidArgumentError(quoted + ": expected ngram[:N], layers:N or model:PATH");
  const std::string_view kind = spec.substr(0, colon);
  const std::string_view arg = spec.substr(colon + 1);
  DraftSpec d;
  if (kind == "ngram" || kind == "layers") {
    d.kind = kind == "ngram" ? DraftSpec::Kind::kNgram : DraftSpec::Kind::kLayers;
    if (!ParseSmallDecimal(arg, &d.n))
      return InvalidArgumentError(quoted + ": N must be a positive decimal integer");
    if (d.n < 1) return InvalidArgumentError(quoted + ": N must be at least 1");
    if (d.kind == DraftSpec::Kind::kNgram && d.n > SpeculationRequest::kMaxNgram)
      return InvalidArgumentError(quoted + ": n-gram length must be at most " +
                                  std::to_string(SpeculationRequest::kMaxNgram));
    return d;
  }
  if (kind == "model") {
    if (arg.empty()) return InvalidArgumentError(quoted + ": empty model path");
    if (arg.size() > 4096) return InvalidArgumentError("draft model path is too long");
    d.kind = DraftSpec::Kind::kModel;
    d.model_path = std::string(arg);
    return d;
  }
  return InvalidArgumentError(quoted + ": unknown speculator '" + std::string(kind.substr(0, 32)) +
                              "' (expected ngram, layers or model)");
}

Status ValidateSpeculation(const SpeculationRequest& r, int32_t num_layers) {
  using S = SpeculationRequest;
  if (r.depth() > S::kMaxTreeDepth)
    return InvalidArgumentError("speculation tree depth " + std::to_string(r.depth()) +
                                " exceeds " + std::to_string(S::kMaxTreeDepth));
  for (size_t i = 0; i < r.tree.size(); ++i) {
    if (r.tree[i] < 1 || r.tree[i] > S::kMaxTreeWidth)
      return InvalidArgumentError("speculation tree[" + std::to_string(i) +
                                  "] = " + std::to_string(r.tree[i]) + " is outside 1.." +
                                  std::to_string(S::kMaxTreeWidth));
  }
  if (r.num_nodes() > S::kMaxTreeNodes)
    return InvalidArgumentError("speculation tree has " + std::to_string(r.num_nodes()) +
                                " nodes; at most " + std::to_string(S::kMaxTreeNodes) +
                                " are allowed");
  if (static_cast<int32_t>(r.drafts.size()) > S::kMaxDrafts)
    return InvalidArgumentError("at most " + std::to_string(S::kMaxDrafts) +
                                " draft speculators are allowed");
  for (size_t i = 0; i < r.drafts.size(); ++i) {
    const DraftSpec& d = r.drafts[i];
    for (size_t j = 0; j < i; ++j)
      if (r.drafts[j] == d)
        return InvalidArgumentError("draft spec '" + d.ToString() + "' appears twice");
    if (d.kind == DraftSpec::Kind::kLayers && num_layers > 0 && d.n >= num_layers)
      return InvalidArgumentError("draft spec '" + d.ToString() + "': the model has " +
                                  std::to_string(num_layers) +
                                  " layers; self-speculation must use fewer");
  }
  return Status::Ok();
}

}  // namespace specinfer
