#include "server/generation_defaults.h"

#include <fmt/format.h>

#include "server/request.h"

namespace specinfer {

Status GenerationDefaults::Validate() const {
  if (!(temperature >= 0.0f && temperature <= RequestLimits::kMaxTemperature))
    return InvalidArgumentError(
        fmt::format("default temperature must be between 0 and 2, got {:g}", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return InvalidArgumentError(fmt::format("default top_p must be in (0, 1], got {:g}", top_p));
  if (top_k < -1)
    return InvalidArgumentError(
        fmt::format("default top_k must be -1 or 0 (off) or positive, got {}", top_k));
  if (max_tokens < 1 && max_tokens != -1)
    return InvalidArgumentError(fmt::format(
        "default max_tokens must be at least 1 (or -1: the endpoint's own), got {}", max_tokens));
  return Status::Ok();
}

std::string GenerationDefaults::ToString() const {
  return fmt::format("temperature {:g}, top_p {:g}, top_k {}, max_tokens {}", temperature, top_p,
                     top_k > 0 ? std::to_string(top_k) : "off",
                     max_tokens > 0 ? std::to_string(max_tokens) : "endpoint default");
}

}  // namespace specinfer
