// The API-key check both frontends (HTTP's "Authorization" header, gRPC's "authorization"
// metadata) share: "Bearer KEY", compared in constant time.
//
// Thread safety: pure functions.
#pragma once

#include <string_view>

namespace specinfer {

// Whether `given` (from the client) equals `secret` (the configured key), in time that depends
// only on given.size(): no early exit at the first differing byte, nor at a length mismatch, so
// timing reveals neither a prefix of the key nor its length.
bool ConstantTimeEquals(std::string_view given, std::string_view secret);

// Whether an authorization value is exactly "Bearer " + `key` (the key compared in constant
// time). `key` must not be empty (an empty key means no check; the caller decides that).
bool BearerKeyMatches(std::string_view authorization, std::string_view key);

}  // namespace specinfer
