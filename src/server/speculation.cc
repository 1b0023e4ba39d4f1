#include "server/speculation.h"

#include <algorithm>
#include <limits>

namespace specinfer {

int32_t SpeculationRequest::num_nodes() const {
  return static_cast<int32_t>(
      std::min<int64_t>(TreeShape{tree}.MaxNodes(), std::numeric_limits<int32_t>::max()));
}

Status ValidateSpeculation(const SpeculationRequest& r, int32_t num_layers) {
  if (!r.tree.empty()) {
    Status tree = TreeShape{r.tree}.Validate(kServingLimits);
    if (!tree.ok()) return tree.WithContext("speculation");
  }
  return ValidateDrafts(r.drafts, kServingLimits, num_layers);
}

}  // namespace specinfer
