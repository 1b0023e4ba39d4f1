// Status and StatusOr<T>: errors are values in specinfer.
//
// Every fallible operation returns a Status (or a StatusOr<T> carrying a value on success).
// The codes are exactly the gRPC status codes, so a Status crosses the RPC layer unchanged and
// maps one-to-one to an HTTP status in the gateway (HttpStatusFor). Nothing a request or a file
// can trigger aborts the process; assertions guard programmer invariants only.
//
// Thread safety: Status and StatusOr are values; distinct objects may be used from any thread.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace specinfer {

// Numbering equals grpc::StatusCode.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view StatusCodeName(StatusCode code);

// HTTP status a gateway should answer with for this code (OpenAI-style APIs).
int HttpStatusFor(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status NotFoundError(std::string msg) {
  return Status(StatusCode::kNotFound, std::move(msg));
}
inline Status DataLossError(std::string msg) {  // corrupt or truncated data
  return Status(StatusCode::kDataLoss, std::move(msg));
}
inline Status OutOfRangeError(std::string msg) {
  return Status(StatusCode::kOutOfRange, std::move(msg));
}
inline Status ResourceExhaustedError(std::string msg) {
  return Status(StatusCode::kResourceExhausted, std::move(msg));
}
inline Status FailedPreconditionError(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status UnimplementedError(std::string msg) {
  return Status(StatusCode::kUnimplemented, std::move(msg));
}
inline Status UnavailableError(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status InternalError(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}
inline Status CancelledError(std::string msg) {
  return Status(StatusCode::kCancelled, std::move(msg));
}

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : v_(value) {}                 // NOLINT(runtime/explicit)
  StatusOr(T&& value) : v_(std::move(value)) {}           // NOLINT(runtime/explicit)
  StatusOr(Status status) : v_(std::move(status)) {       // NOLINT(runtime/explicit)
    assert(!std::get<Status>(v_).ok() && "StatusOr built from an OK status");
  }
  template <typename U,
            typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT(runtime/explicit)

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace specinfer

#define SI_CONCAT_INNER_(a, b) a##b
#define SI_CONCAT_(a, b) SI_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define SI_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::specinfer::Status si_status_ = (expr);           \
    if (!si_status_.ok()) return si_status_;           \
  } while (0)

// `SI_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr, or returns its error.
#define SI_ASSIGN_OR_RETURN(lhs, expr) \
  SI_ASSIGN_OR_RETURN_IMPL_(SI_CONCAT_(si_statusor_, __LINE__), lhs, expr)
#define SI_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
