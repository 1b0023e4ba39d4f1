// Micro-benchmark of the tile kernels (backend/cpu/tiled_matrix.h): one product of a rows x cols
// weight matrix with n tokens, single-threaded, for each weight type, token count and kernel set
// this CPU runs. Reports the fastest of --runs runs in thread CPU time (the least disturbed on a
// busy machine) as multiply-adds per second, and the weight bytes streamed per second.
//
//   bench_tiles [--rows 1536] [--cols 576] [--tokens 1,8,32] [--types Q4_1,Q8_0] [--runs 15]
//
// 1536 x 576 is SmolLM2-135M's ffn_gate/ffn_up (Q4_1: 540 KiB, L2-resident); --rows 49152 streams
// from memory like its output projection.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/simd.h"
#include "backend/cpu/tiled_matrix.h"
#include "tensor/half.h"

namespace {

using namespace specinfer;

std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> m(RowBytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (!IsQuantized(t)) {
    const size_t es = GetDTypeTraits(t).block_bytes;
    for (size_t i = 0; i < m.size() / es; ++i) {
      const float v = normal(rng);
      if (t == DType::kF32) std::memcpy(m.data() + 4 * i, &v, 4);
      const uint16_t h = t == DType::kF16 ? Fp32ToFp16(v) : Fp32ToBf16(v);
      if (t != DType::kF32) std::memcpy(m.data() + 2 * i, &h, 2);
    }
    return m;
  }
  for (auto& b : m) b = static_cast<uint8_t>(byte(rng));
  const size_t bb = GetDTypeTraits(t).block_bytes;
  for (size_t off = 0; off < m.size(); off += bb) {
    const uint16_t d = Fp32ToFp16(0.01f), mn = Fp32ToFp16(-0.1f);
    std::memcpy(m.data() + off, &d, 2);
    if (t == DType::kQ4_1 || t == DType::kQ5_1) std::memcpy(m.data() + off + 2, &mn, 2);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Benchmark the CPU tile kernels"};
  int64_t rows = 1536, cols = 576;
  int runs = 15;
  std::vector<int> tokens = {1, 8, 32};
  std::vector<std::string> types = {"Q4_1", "Q8_0"};
  app.add_option("--rows", rows, "weight rows")->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "weight columns (a multiple of 32)")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "token counts")->check(CLI::Range(1, 4096));
  app.add_option("--types", types, "weight types");
  bool local_out = false;
  app.add_flag("--local-out", local_out,
               "write every group's outputs to one small buffer (isolates the cost of the "
               "strided output rows)");
  app.add_option("--runs", runs, "timed runs; the fastest is reported")->check(CLI::Range(1, 999));
  CLI11_PARSE(app, argc, argv);
  if (cols % 32 != 0) {
    std::fprintf(stderr, "bench_tiles: --cols must be a multiple of 32\n");
    return 2;
  }
  std::mt19937 rng(42);
  std::printf("matrix %lld x %lld, single thread, fastest of %d runs\n",
              static_cast<long long>(rows), static_cast<long long>(cols), runs);
  std::printf("%-6s %-7s %7s %12s %10s %10s\n", "type", "kernels", "tokens", "us/product",
              "GMAC/s", "GB/s");
  for (const std::string& name : types) {
    DType t = DType::kCount;
    for (size_t i = 0; i < static_cast<size_t>(DType::kCount); ++i)
      if (DTypeName(static_cast<DType>(i)) == name) t = static_cast<DType>(i);
    if (t == DType::kCount || !cpu::TiledMatrix::Supports(t)) {
      std::fprintf(stderr, "bench_tiles: no tile kernels for '%s'\n", name.c_str());
      return 2;
    }
    const std::vector<uint8_t> bytes = RandomMatrix(t, rows, cols, rng);
    StatusOr<cpu::TiledMatrix> m =
        cpu::TiledMatrix::Tile(WeightMatrix{t, rows, cols, bytes.data()});
    if (!m.ok()) {
      std::fprintf(stderr, "bench_tiles: %s\n", m.status().ToString().c_str());
      return 1;
    }
    for (cpu::KernelIsa isa : {cpu::KernelIsa::kAvx2, cpu::KernelIsa::kAvx512}) {
      const cpu::TileOps* ops = cpu::TileOpsForIsa(t, isa);
      const char* isa_name = isa == cpu::KernelIsa::kAvx2 ? "avx2" : "avx512";
      if (ops == nullptr) {
        std::printf("%-6s %-7s (not available on this CPU)\n", name.c_str(), isa_name);
        continue;
      }
      for (int n : tokens) {
        std::vector<float> x(static_cast<size_t>(n) * cols);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : x) v = normal(rng);
        const int64_t xs = IsQuantized(t) ? cols / 32 : cols;
        std::vector<cpu::TileAct> act(IsQuantized(t) ? static_cast<size_t>(n) * xs : 0);
        for (int i = 0; i < n && IsQuantized(t); ++i) ops->prep(&x[i * cols], cols, &act[i * xs]);
        const void* xa = IsQuantized(t) ? static_cast<const void*>(act.data()) : x.data();
        const size_t xbytes = IsQuantized(t) ? sizeof(cpu::TileAct) : sizeof(float);
        std::vector<float> y(static_cast<size_t>(n) * m->groups() * cpu::kTileRows);
        const int64_t ys = m->groups() * cpu::kTileRows;
        auto product = [&] {
          for (int64_t g = 0; g < m->groups(); ++g)
            for (int t0 = 0; t0 < n; t0 += cpu::kMaxTileTokens)
              ops->dot(cols, m->group(g),
                       static_cast<const uint8_t*>(xa) + static_cast<size_t>(t0) * xs * xbytes,
                       xs, std::min(cpu::kMaxTileTokens, n - t0),
                       local_out ? y.data() : &y[t0 * ys + g * cpu::kTileRows],
                       local_out ? cpu::kTileRows : ys);
        };
        product();
        // Thread CPU time: on a machine busy with other work, waiting for a core is not counted.
        auto cpu_now = [] {
          timespec ts{};
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
          return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
        };
        double best = 1e30;
        for (int r = 0; r < runs; ++r) {
          const double t0 = cpu_now();
          product();
          best = std::min(best, cpu_now() - t0);
        }
        const double macs = static_cast<double>(rows) * cols * n;
        std::printf("%-6s %-7s %7d %12.1f %10.1f %10.2f\n", name.c_str(), isa_name, n, best * 1e6,
                    macs / best * 1e-9, m->groups() * m->group_bytes() / best * 1e-9);
      }
    }
  }
  return 0;
}
