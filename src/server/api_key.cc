#include "server/api_key.h"

#include <cstddef>

namespace specinfer {

bool ConstantTimeEquals(std::string_view given, std::string_view secret) {
  // Walk the client's bytes, comparing with the secret's (cycled when `given` is longer, so no
  // read is out of bounds), and fold any length difference into the same accumulator.
  size_t diff = given.size() ^ secret.size();
  if (secret.empty()) return given.empty();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ secret[i % secret.size()]);
  return diff == 0;
}

bool BearerKeyMatches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (authorization.substr(0, kPrefix.size()) != kPrefix) return false;  // not secret
  return ConstantTimeEquals(authorization.substr(kPrefix.size()), key);
}

}  // namespace specinfer
