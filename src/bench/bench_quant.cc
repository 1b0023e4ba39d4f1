// Micro-benchmark of the CPU dot-product kernels: one matrix-vector product (every weight row
// dotted with one activation row) per iteration, single-threaded, for each weight type and kernel
// set. Reports the median over several runs (ns per row, GB/s of weight bytes streamed), the
// fastest run (a better estimate on a machine busy with other work), the cost of quantising the
// activation row (from_float) once, and the AVX2 speed-up over the scalar kernels.
//
//   bench_quant [--rows 1536] [--cols 576] [--runs 9] [--ms 100] [--types Q4_1,Q8_0,F32]
//
// 1536 x 576 is SmolLM2-135M's ffn_gate/ffn_up (Q4_1: 540 KiB, L2-resident on most CPUs); use
// e.g. --rows 49152 to stream from memory like the output projection does.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/quants.h"
#include "backend/cpu/simd.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<DType> ParseType(const std::string& name) {
  for (size_t i = 0; i < static_cast<size_t>(DType::kCount); ++i) {
    if (DTypeName(static_cast<DType>(i)) == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

// Random weights: Gaussian floats, or random quant bytes with small positive/negative scales.
std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> m(RowBytes(t, cols) * rows);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (t == DType::kF32) {
    for (size_t i = 0; i < m.size() / 4; ++i) {
      const float v = normal(rng);
      std::memcpy(m.data() + 4 * i, &v, 4);
    }
    return m;
  }
  if (t == DType::kF16 || t == DType::kBF16) {
    for (size_t i = 0; i < m.size() / 2; ++i) {
      const uint16_t h = t == DType::kF16 ? Fp32ToFp16(normal(rng)) : Fp32ToBf16(normal(rng));
      std::memcpy(m.data() + 2 * i, &h, 2);
    }
    return m;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : m) b = static_cast<uint8_t>(byte(rng));
  const size_t bb = GetDTypeTraits(t).block_bytes;
  // Byte offsets of the fp16 scale d and (where there is one) minimum of each block.
  size_t d_off = 0, m_off = 0;
  bool has_m = t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K;
  if (t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K) m_off = 2;
  if (t == DType::kQ2_K) d_off = 80, m_off = 82, has_m = true;
  if (t == DType::kQ3_K) d_off = 108;
  if (t == DType::kQ6_K) d_off = 208;
  for (size_t off = 0; off < m.size(); off += bb) {
    const uint16_t d = Fp32ToFp16(0.01f * (byte(rng) < 128 ? 1 : -1));
    const uint16_t mn = Fp32ToFp16(t == DType::kQ4_1 || t == DType::kQ5_1 ? -0.1f : 0.01f);
    if (t == DType::kQ8_K) {
      const float df = 0.01f;
      std::memcpy(m.data() + off, &df, 4);
      continue;
    }
    std::memcpy(m.data() + off + d_off, &d, 2);
    if (has_m) std::memcpy(m.data() + off + m_off, &mn, 2);
  }
  return m;
}

struct Result {
  double ns_per_row = 0;       // median run
  double best_ns_per_row = 0;  // fastest run (least disturbed by other load on the machine)
  double gbps = 0;
  double from_float_ns = 0;  // one activation row
  float checksum = 0;
};

struct Timing {
  double median_ns = 0, min_ns = 0;  // per call
};

template <typename Fn>
Timing TimeRuns(int runs, int64_t iters, Fn&& fn) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) fn();
    const auto t1 = Clock::now();
    t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

// Iterations so one run takes about `ms` milliseconds.
template <typename Fn>
int64_t Calibrate(double ms, Fn&& fn) {
  int64_t iters = 1;
  for (;;) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) fn();
    const double el = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (el > ms / 4 || iters > (int64_t{1} << 30)) {
      return std::max<int64_t>(1, static_cast<int64_t>(iters * ms / std::max(el, 1e-3)));
    }
    iters *= 4;
  }
}

Result Run(const cpu::TypeOps& ops, DType t, const std::vector<uint8_t>& w, int64_t rows,
           int64_t cols, const std::vector<float>& x, int runs, double ms) {
  Result res;
  const size_t row_bytes = RowBytes(t, cols);
  std::vector<uint8_t> xq;
  const void* act = x.data();
  if (ops.from_float != nullptr) {
    xq.resize(RowBytes(ops.vec_dot_type, cols));
    auto quantize = [&] { ops.from_float(x.data(), xq.data(), cols); };
    res.from_float_ns = TimeRuns(runs, Calibrate(ms / 4, quantize), quantize).median_ns;
    act = xq.data();
  }
  std::vector<float> y(rows);
  auto matvec = [&] {
    for (int64_t r = 0; r < rows; ++r) y[r] = ops.vec_dot(cols, w.data() + r * row_bytes, act);
    asm volatile("" : : "r"(y.data()) : "memory");  // keep the stores
  };
  const Timing tm = TimeRuns(runs, Calibrate(ms, matvec), matvec);
  res.ns_per_row = tm.median_ns / static_cast<double>(rows);
  res.best_ns_per_row = tm.min_ns / static_cast<double>(rows);
  res.gbps = static_cast<double>(w.size()) / tm.median_ns;  // bytes per ns = GB/s
  for (float v : y) res.checksum += v;
  return res;
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) {
  using namespace specinfer;
  CLI::App app{"Benchmark the CPU quantised dot-product kernels (scalar vs AVX2)"};
  int64_t rows = 1536, cols = 576;
  int runs = 9;
  double ms = 100;
  std::string types = "Q4_1,Q8_0,F32";
  app.add_option("--rows", rows, "weight rows (output features)")->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "weight columns (input features; a multiple of the block size)")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", runs, "timed runs per case; the median is reported")
      ->check(CLI::PositiveNumber);
  app.add_option("--ms", ms, "approximate duration of one run, milliseconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--types", types,
                 "comma-separated weight types: F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q8_1,"
                 "Q2_K,Q3_K,Q4_K,Q5_K,Q6_K (--cols a multiple of 256 for these)");
  CLI11_PARSE(app, argc, argv);

  std::vector<DType> dtypes;
  std::stringstream ss(types);
  for (std::string name; std::getline(ss, name, ',');) {
    const std::optional<DType> t = ParseType(name);
    if (!t || cpu::GetTypeOpsForIsa(*t, cpu::KernelIsa::kScalar) == nullptr) {
      std::fprintf(stderr, "bench_quant: unsupported type '%s'\n", name.c_str());
      return 2;
    }
    if (IsQuantized(*t) && cols % GetDTypeTraits(*t).block_size != 0) {
      std::fprintf(stderr, "bench_quant: --cols %lld is not a multiple of %s's block size\n",
                   static_cast<long long>(cols), name.c_str());
      return 2;
    }
    dtypes.push_back(*t);
  }

  const cpu::CpuFeatures& f = cpu::GetCpuFeatures();
  std::printf("matrix %lld x %lld, single thread, median of %d runs; cpu avx2=%d fma=%d f16c=%d\n",
              static_cast<long long>(rows), static_cast<long long>(cols), runs, f.avx2, f.fma,
              f.f16c);
  std::printf("%-6s %-7s %8s %10s %9s %10s %14s %8s\n", "type", "kernels", "MiB", "ns/row", "GB/s",
              "best ns/row", "from_float ns", "speedup");
  std::mt19937 rng(42);
  std::vector<float> x(cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  for (DType t : dtypes) {
    const std::vector<uint8_t> w = RandomMatrix(t, rows, cols, rng);
    double scalar_ns = 0;
    float scalar_sum = 0;
    for (cpu::KernelIsa isa : {cpu::KernelIsa::kScalar, cpu::KernelIsa::kAvx2}) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      const char* isa_name = isa == cpu::KernelIsa::kScalar ? "scalar" : "avx2";
      if (ops == nullptr) {
        std::printf("%-6s %-7s (not available on this CPU)\n", std::string(DTypeName(t)).c_str(),
                    isa_name);
        continue;
      }
      const Result r = Run(*ops, t, w, rows, cols, x, runs, ms);
      char speed[32] = "";
      if (isa == cpu::KernelIsa::kScalar) {
        scalar_ns = r.ns_per_row;
        scalar_sum = r.checksum;
      } else {
        std::snprintf(speed, sizeof(speed), "%.1fx", scalar_ns / r.ns_per_row);
        const float tol = 1e-3f * (std::fabs(scalar_sum) + 1.0f);
        if (std::fabs(r.checksum - scalar_sum) > tol) {
          std::fprintf(stderr, "bench_quant: %s results differ: scalar %g, avx2 %g\n",
                       std::string(DTypeName(t)).c_str(), scalar_sum, r.checksum);
        }
      }
      char ff[32] = "-";
      if (ops->from_float) std::snprintf(ff, sizeof(ff), "%.0f", r.from_float_ns);
      std::printf("%-6s %-7s %8.2f %10.1f %9.2f %10.1f %14s %8s\n",
                  std::string(DTypeName(t)).c_str(), isa_name,
                  static_cast<double>(w.size()) / (1 << 20), r.ns_per_row, r.gbps,
                  r.best_ns_per_row, ff, speed);
    }
  }
  return 0;
}
