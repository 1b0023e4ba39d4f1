// Fuzz target: the speculation settings grammar (spec/spec_grammar.h): draft specs and tree
// shapes, under the engine's and the servers' limits. The input is one spec or shape per line.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "spec/spec_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const SpeculationLimits& limits : {kEngineLimits, kServingLimits}) {
    std::vector<DraftSpec> drafts;
    for (size_t begin = 0; begin <= text.size();) {
      size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(begin, end - begin);
      auto draft = ParseDraftSpec(line, limits);
      if (draft.ok()) {
        (void)draft->ToString();
        (void)CheckDraftFitsModel(*draft, 12);
        drafts.push_back(*draft);
      }
      auto shape = TreeShape::Parse(line, limits);
      if (shape.ok()) (void)shape->ToString();
      begin = end + 1;
    }
    (void)ValidateDrafts(drafts, limits, 12);
  }
  return 0;
}
