// Clang thread-safety annotations (checked with -Wthread-safety under clang; no-ops elsewhere).
#pragma once

#if defined(__clang__)
#define SI_GUARDED_BY(x) __attribute__((guarded_by(x)))
#define SI_EXCLUDES(...) __attribute__((locks_excluded(__VA_ARGS__)))
#else
#define SI_GUARDED_BY(x)
#define SI_EXCLUDES(...)
#endif
