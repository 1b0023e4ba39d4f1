// A request error as the frontends report it: a Status code (gRPC uses it as is; the HTTP gateway
// maps it with HttpStatusFor unless an explicit HTTP status is set, e.g. 413) plus the fields of
// OpenAI's error object {"error": {"message", "type", "param", "code"}}.
//
// Thread safety: a plain value.
#pragma once

#include <string>
#include <utility>

#include "specinfer/status.h"

namespace specinfer {

struct ApiError {
  StatusCode code = StatusCode::kOk;
  std::string message;
  std::string param;       // the request field at fault; "" for none (JSON null)
  std::string error_code;  // OpenAI's machine-readable "code" (e.g. "model_not_found"); "" = null
  int http_status = 0;     // 0: HttpStatusFor(code)

  bool ok() const { return code == StatusCode::kOk; }
  int HttpStatus() const { return http_status != 0 ? http_status : HttpStatusFor(code); }
  Status ToStatus() const { return ok() ? Status() : Status(code, message); }

  static ApiError Invalid(std::string message, std::string param = "") {
    return ApiError{StatusCode::kInvalidArgument, std::move(message), std::move(param), "", 0};
  }
  static ApiError FromStatus(const Status& s, std::string param = "") {
    return ApiError{s.code(), s.message(), std::move(param), "", 0};
  }
};

}  // namespace specinfer
