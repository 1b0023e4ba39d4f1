// Guarded(what, f): runs `f` (returning Status or StatusOr) and turns an exception into an
// Internal error ("<what> failed: ..."), so that a throwing step fails one sequence or one pass
// instead of the serving process. Used by the engine core's scheduler and executor.
#pragma once

#include <exception>
#include <string>

#include "specinfer/status.h"

namespace specinfer {

template <typename F>
auto Guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& ex) {
    return InternalError(std::string(what) + " failed: " + ex.what());
  }
}

}  // namespace specinfer
