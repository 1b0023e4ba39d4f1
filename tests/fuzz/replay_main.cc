// Standalone driver for the fuzz harnesses where libFuzzer is not used (gcc, normal and sanitizer
// builds): runs LLVMFuzzerTestOneInput on every file given (directories: every file in them,
// recursively, in name order), then optionally on N deterministic mutations of those files.
//
//   NAME_fuzz [--mutate N] [--seed S] [--max-len BYTES] [--timeout SECONDS]
//             [--memory-limit-mb MB] [--verbose] PATH...
//
// Mutations (a few per input, chosen by a seeded std::mt19937_64, so a run is repeatable): bit
// flips, bytes set to boundary values, 2/4/8-byte little-endian boundary integers written over the
// input (lengths and counts in binary headers), byte inserts, range deletes and duplicates,
// truncation, and splices with another seed. Inputs stay under --max-len (default 64 KiB).
//
// Exit status: 0 when every input returned 0; 1 when a harness returned something else or the
// arguments are wrong. A crash, sanitizer report or hang (an input running longer than --timeout,
// default 10 s) ends the process with a message naming the input; the input's bytes are written
// to ./fuzz-crash-input so that `NAME_fuzz fuzz-crash-input` reproduces it. Memory: outside
// sanitizer builds the address space is capped (--memory-limit-mb, default 4096; 0: none), so an
// input that makes a parser allocate gigabytes ends in std::bad_alloc, i.e. a crash, instead of
// passing on a machine that happens to have the memory.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional hook that libFuzzer also honours; a harness may define it to set itself up once.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));
// AddressSanitizer's hook, called before it ends the process on a report (absent without ASan).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

constexpr char kCrashFile[] = "fuzz-crash-input";

// The input being run, for the crash handlers (which may only use async-signal-safe calls).
const uint8_t* g_data = nullptr;
size_t g_size = 0;
char g_label[512] = "";

void WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return;
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void DumpCurrentInput() {
  if (g_data == nullptr && g_size == 0) return;
  static const char kHead[] = "\nfuzz replay: failing input: ";
  WriteAll(2, kHead, sizeof(kHead) - 1);
  WriteAll(2, g_label, strlen(g_label));
  static const char kTail[] = "\nfuzz replay: its bytes are in ./fuzz-crash-input\n";
  WriteAll(2, kTail, sizeof(kTail) - 1);
  int fd = open(kCrashFile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    WriteAll(fd, g_data, g_size);
    close(fd);
  }
}

void OnFatalSignal(int sig) {
  if (sig == SIGALRM) {
    static const char kMsg[] = "\nfuzz replay: input ran past the --timeout (a hang)\n";
    WriteAll(2, kMsg, sizeof(kMsg) - 1);
  }
  DumpCurrentInput();
  signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  raise(sig == SIGALRM ? SIGABRT : sig);
}

struct Options {
  long mutations = 0;
  uint64_t seed = 1;
  size_t max_len = 64 * 1024;
  unsigned timeout_s = 10;
  uint64_t memory_limit_mb = 4096;
  bool verbose = false;
  std::vector<std::string> paths;
};

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fuzz replay: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--mutate" || a == "--seed" || a == "--max-len" || a == "--timeout" ||
        a == "--memory-limit-mb") {
      const char* v = value(a.c_str());
      if (v == nullptr) return false;
      char* end = nullptr;
      unsigned long long n = std::strtoull(v, &end, 10);
      if (*v == '\0' || *end != '\0') {
        std::fprintf(stderr, "fuzz replay: %s takes a number, not '%s'\n", a.c_str(), v);
        return false;
      }
      if (a == "--mutate") o->mutations = static_cast<long>(n);
      if (a == "--seed") o->seed = n;
      if (a == "--max-len") o->max_len = std::max<size_t>(1, n);
      if (a == "--timeout") o->timeout_s = static_cast<unsigned>(n);
      if (a == "--memory-limit-mb") o->memory_limit_mb = n;
    } else if (a == "--verbose") {
      o->verbose = true;
    } else if (a.starts_with("-")) {
      std::fprintf(stderr, "fuzz replay: unknown option %s\n", a.c_str());
      return false;
    } else {
      o->paths.push_back(a);
    }
  }
  if (o->paths.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--mutate N] [--seed S] [--max-len BYTES] [--timeout SECONDS] "
                 "[--memory-limit-mb MB] [--verbose] FILE_OR_DIR...\n",
                 argv[0]);
    return false;
  }
  return true;
}

struct Input {
  std::string name;
  std::vector<uint8_t> bytes;
};

bool ReadInputs(const std::vector<std::string>& paths, std::vector<Input>* out) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p, ec)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz replay: %s is neither a file nor a directory\n", p.c_str());
      return false;
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    Input input{f, std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {})};
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "fuzz replay: cannot read %s\n", f.c_str());
      return false;
    }
    out->push_back(std::move(input));
  }
  return true;
}

// One random edit of `b`; `other` is another seed for splices.
void MutateOnce(std::mt19937_64& rng, std::vector<uint8_t>& b, const std::vector<uint8_t>& other,
                size_t max_len) {
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static constexpr uint8_t kBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '"', '{', '}', '[', ']',
                                       '\\', ':',  ',',  '\n', '%',  '<', '>', '0', '9', '-'};
  static constexpr uint64_t kInts[] = {
      0,          1,          2,          0x7f,        0x80,       0xff,       0x7fff,     0xffff,
      0x7fffffff, 0x80000000, 0xffffffff, 0x100000000, 1ull << 40, 1ull << 62, ~0ull >> 1, ~0ull};
  switch (rng() % 9) {
    case 0:  // flip one bit
      if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:  // a boundary or syntax byte
      if (!b.empty()) b[below(b.size())] = kBytes[below(std::size(kBytes))];
      break;
    case 2: {  // a boundary integer, little-endian, over 2, 4 or 8 bytes
      const size_t width = size_t{2} << below(3);
      if (b.size() < width) break;
      const size_t at = below(b.size() - width + 1);
      const uint64_t v = kInts[below(std::size(kInts))];
      for (size_t i = 0; i < width; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 3: {  // insert 1..8 bytes
      const size_t n = 1 + below(8);
      const size_t at = below(b.size() + 1);
      for (size_t i = 0; i < n; ++i) {
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at),
                 (rng() & 1) ? kBytes[below(std::size(kBytes))] : static_cast<uint8_t>(rng()));
      }
      break;
    }
    case 4: {  // delete a range
      if (b.empty()) break;
      const size_t at = below(b.size());
      const size_t n = 1 + below(std::min<size_t>(b.size() - at, 16));
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
              b.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    case 5:  // truncate
      b.resize(below(b.size() + 1));
      break;
    case 6: {  // duplicate a range in place
      if (b.empty()) break;
      const size_t at = below(b.size());
      const size_t n = 1 + below(std::min<size_t>(b.size() - at, 64));
      std::vector<uint8_t> piece(b.begin() + static_cast<std::ptrdiff_t>(at),
                                 b.begin() + static_cast<std::ptrdiff_t>(at + n));
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(at + n), piece.begin(), piece.end());
      break;
    }
    case 7: {  // splice: our head, the other's tail
      const size_t cut = below(b.size() + 1);
      const size_t from = below(other.size() + 1);
      b.resize(cut);
      b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
      break;
    }
    case 8: {  // copy a range of the input over another place
      if (b.size() < 2) break;
      const size_t n = 1 + below(std::min<size_t>(b.size() / 2, 32));
      const size_t src = below(b.size() - n + 1);
      const size_t dst = below(b.size() - n + 1);
      std::memmove(b.data() + dst, b.data() + src, n);
      break;
    }
  }
  if (b.size() > max_len) b.resize(max_len);
}

bool RunOne(const uint8_t* data, size_t size, const std::string& label, const Options& o) {
  g_data = data;
  g_size = size;
  std::snprintf(g_label, sizeof(g_label), "%s", label.c_str());
  if (o.verbose) std::fprintf(stderr, "fuzz replay: %s (%zu bytes)\n", label.c_str(), size);
  alarm(o.timeout_s);
  // A copy of exactly `size` bytes, so that an over-read is a heap overflow under ASan.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(copy.get(), data, size);
  const int rc = LLVMFuzzerTestOneInput(size == 0 ? nullptr : copy.get(), size);
  alarm(0);
  g_data = nullptr;
  g_size = 0;
  if (rc != 0 && rc != -1) {
    std::fprintf(stderr, "fuzz replay: %s: LLVMFuzzerTestOneInput returned %d\n", label.c_str(),
                 rc);
    return false;
  }
  return true;
}

}  // namespace

// Which sanitizer this binary is built with: GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__; clang 14 (build-asan/) answers only __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define SPECINFER_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPECINFER_REPLAY_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SPECINFER_REPLAY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPECINFER_REPLAY_TSAN 1
#endif
#endif
#ifndef SPECINFER_REPLAY_ASAN
#define SPECINFER_REPLAY_ASAN 0
#endif
#ifndef SPECINFER_REPLAY_TSAN
#define SPECINFER_REPLAY_TSAN 0
#endif

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 1;
  std::vector<Input> inputs;
  if (!ReadInputs(o.paths, &inputs)) return 1;
  if (inputs.empty()) {
    std::fprintf(stderr, "fuzz replay: no input files\n");
    return 1;
  }
#if !SPECINFER_REPLAY_ASAN && !SPECINFER_REPLAY_TSAN
  // (The sanitizers reserve terabytes of shadow address space; they are not capped.)
  if (o.memory_limit_mb > 0) {
    const rlim_t bytes = static_cast<rlim_t>(o.memory_limit_mb) << 20;
    const rlimit limit{bytes, bytes};
    setrlimit(RLIMIT_AS, &limit);
  }
#endif
#if SPECINFER_REPLAY_ASAN
  // ASan handles the fault signals itself (its report is the useful part) and then calls the
  // death callback; an abort (a failed assertion) or a hang is ours.
  for (int sig : {SIGABRT, SIGALRM}) signal(sig, OnFatalSignal);
#else
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) signal(sig, OnFatalSignal);
#endif
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(DumpCurrentInput);
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);

  const auto start = std::chrono::steady_clock::now();
  bool ok = true;
  for (const Input& in : inputs) ok &= RunOne(in.bytes.data(), in.bytes.size(), in.name, o);

  std::mt19937_64 rng(o.seed);
  for (long i = 0; i < o.mutations; ++i) {
    const Input& base = inputs[rng() % inputs.size()];
    const Input& other = inputs[rng() % inputs.size()];
    std::vector<uint8_t> b = base.bytes;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) MutateOnce(rng, b, other.bytes, o.max_len);
    const std::string label = "mutation " + std::to_string(i) + " (--seed " +
                              std::to_string(o.seed) + ") of " + base.name;
    ok &= RunOne(b.data(), b.size(), label, o);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz replay: %zu corpus files, %ld mutations, %.2f s: %s\n", inputs.size(),
              o.mutations, secs, ok ? "all returned 0" : "FAILED");
  return ok ? 0 : 1;
}
