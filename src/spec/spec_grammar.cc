#include "spec/spec_grammar.h"

#include <algorithm>
#include <charconv>

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

// "draft 'SPEC'", cut to 64 bytes: specs come from clients, messages go back to them and logs.
std::string Quoted(std::string_view spec) {
  return "draft '" + std::string(spec.substr(0, 64)) + (spec.size() > 64 ? "...'" : "'");
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

StatusOr<DraftSpec> ParseDraftSpec(std::string_view spec, const SpeculationLimits& limits) {
  const std::string quoted = Quoted(spec);
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  const std::string_view arg =
      colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  // Spaces may only be part of a model path (where the limits allow them); control characters
  // are nowhere.
  const bool path_spaces = kind == "model" && limits.path_whitespace;
  for (size_t i = 0; i < spec.size(); ++i) {
    const auto c = static_cast<unsigned char>(spec[i]);
    if (c < 0x20 || c == 0x7f || (c == ' ' && !(path_spaces && i > colon)))
      return InvalidArgumentError(quoted + " contains whitespace or control characters");
  }
  DraftSpec d;
  if (kind == "ngram" || kind == "layers") {
    d.kind = kind == "ngram" ? DraftSpec::Kind::kNgram : DraftSpec::Kind::kLayers;
    if (colon == std::string_view::npos) {
      if (d.kind == DraftSpec::Kind::kNgram) return d;  // bare "ngram": the default length
      return InvalidArgumentError(quoted + ": 'layers:K' needs a layer count");
    }
    if (!ParseSmallDecimal(arg, &d.n))
      return InvalidArgumentError(quoted + ": '" + std::string(arg.substr(0, 16)) +
                                  "' is not a positive integer");
    if (d.n < 1) return InvalidArgumentError(quoted + ": the number must be at least 1");
    if (d.kind == DraftSpec::Kind::kNgram && d.n > limits.max_ngram)
      return InvalidArgumentError(quoted + ": n-gram length above " +
                                  std::to_string(limits.max_ngram));
    return d;
  }
  if (kind == "model") {
    if (arg.empty()) return InvalidArgumentError(quoted + ": 'model:PATH' needs a path");
    if (arg.size() > static_cast<size_t>(limits.max_path_bytes))
      return InvalidArgumentError(quoted + ": the path is longer than " +
                                  std::to_string(limits.max_path_bytes) + " bytes");
    d.kind = DraftSpec::Kind::kModel;
    d.model_path = std::string(arg);
    return d;
  }
  return InvalidArgumentError("unknown " + quoted +
                              " (expected ngram[:N], layers:K or model:PATH)");
}

Status CheckDraftFitsModel(const DraftSpec& d, int32_t num_layers) {
  if (d.kind != DraftSpec::Kind::kLayers || d.n < num_layers) return Status::Ok();
  return InvalidArgumentError(
      Quoted(d.ToString()) + ": the model has " + std::to_string(num_layers) +
      " layers; a self-speculative draft takes 1 to " + std::to_string(num_layers - 1));
}

Status ValidateDrafts(std::span<const DraftSpec> drafts, const SpeculationLimits& limits,
                      int32_t num_layers) {
  if (drafts.size() > static_cast<size_t>(limits.max_drafts))
    return InvalidArgumentError("at most " + std::to_string(limits.max_drafts) +
                                " draft speculators are allowed");
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (std::find(drafts.begin(), drafts.begin() + i, drafts[i]) != drafts.begin() + i)
      return InvalidArgumentError(Quoted(drafts[i].ToString()) + " appears twice");
    if (num_layers > 0) SI_RETURN_IF_ERROR(CheckDraftFitsModel(drafts[i], num_layers));
  }
  return Status::Ok();
}

int64_t TreeShape::MaxNodes() const {
  int64_t total = 0, level = 1;
  for (int32_t w : widths) {
    level *= std::max(w, 0);
    total += level;
    if (total > (int64_t{1} << 40)) break;  // far past any limit; avoid overflow
  }
  return total;
}

Status TreeShape::Validate(const SpeculationLimits& limits) const {
  if (widths.empty()) return InvalidArgumentError("tree shape is empty (give widths like 1,1,3,1)");
  if (depth() > limits.max_tree_depth)
    return InvalidArgumentError("tree depth " + std::to_string(depth()) + " exceeds " +
                                std::to_string(limits.max_tree_depth));
  for (size_t i = 0; i < widths.size(); ++i)
    if (widths[i] < 1 || widths[i] > limits.max_tree_width)
      return InvalidArgumentError("tree width " + std::to_string(widths[i]) + " (entry " +
                                  std::to_string(i) + ") outside [1, " +
                                  std::to_string(limits.max_tree_width) + "]");
  if (MaxNodes() > limits.max_tree_nodes)
    return InvalidArgumentError("tree shape " + ToString() + " holds " +
                                std::to_string(MaxNodes()) + " nodes, more than " +
                                std::to_string(limits.max_tree_nodes));
  return Status::Ok();
}

std::string TreeShape::ToString() const {
  std::string s;
  for (size_t i = 0; i < widths.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(widths[i]);
  }
  return s;
}

StatusOr<TreeShape> TreeShape::Parse(std::string_view text, const SpeculationLimits& limits) {
  const std::string bad = "tree shape '" + std::string(text.substr(0, 64)) +
                          "': expected comma-separated widths like 1,1,3,1";
  TreeShape shape;
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  skip_spaces();
  while (i < text.size()) {
    int32_t w = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), w);
    if (ec != std::errc() || end == text.data() + i) return InvalidArgumentError(bad);
    shape.widths.push_back(w);
    if (shape.depth() > limits.max_tree_depth) break;  // Validate reports it
    i = static_cast<size_t>(end - text.data());
    skip_spaces();
    if (i < text.size()) {
      if (text[i] != ',') return InvalidArgumentError(bad);
      ++i;
      skip_spaces();
      if (i == text.size())
        return InvalidArgumentError("tree shape '" + std::string(text.substr(0, 64)) +
                                    "' ends with a comma");
    }
  }
  SI_RETURN_IF_ERROR(shape.Validate(limits));
  return shape;
}

TreeShape TreeShape::Default() {
  static const TreeShape shape = *Parse(kDefaultTreeShape);
  return shape;
}

}  // namespace specinfer
