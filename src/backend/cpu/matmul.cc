#include "backend/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>

#include "backend/cpu/type_ops.h"

namespace specinfer::cpu {

bool SupportsType(DType t) {
  const TypeOps* ops = GetTypeOps(t);
  return ops != nullptr && ops->vec_dot != nullptr && ops->to_float != nullptr;
}

void ForTokens(ThreadPool& pool, int64_t n, int64_t elements_per_token,
               const std::function<void(int64_t, int64_t)>& fn) {
  if (n < kParallelTokens || n * elements_per_token < (int64_t{1} << 13) ||
      pool.num_threads() == 1) {
    fn(0, n);
    return;
  }
  pool.ParallelFor(n, fn, std::max<int64_t>(4, n / (2 * pool.num_threads())));
}

void GetRow(const WeightMatrix& w, int64_t r, float* dst) {
  const TypeOps* ops = GetTypeOps(w.type);
  assert(ops && ops->to_float);
  ops->to_float(w.row(r), dst, w.cols);
}

StatusOr<CpuMatrix> CpuMatrix::Prepare(const WeightMatrix& w) {
  CpuMatrix m;
  m.view = w;
  const bool whole_blocks = !IsQuantized(w.type) || w.cols % kQK == 0;
  if (TiledMatrix::Supports(w.type) && w.rows > 0 && whole_blocks) {
    SI_ASSIGN_OR_RETURN(TiledMatrix tiles, TiledMatrix::Tile(w));
    m.tiles = std::make_shared<const TiledMatrix>(std::move(tiles));
  }
  return m;
}

void MatMul(const CpuMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            std::vector<uint8_t>& scratch, bool batch_invariant) {
  const MatMulTarget target{&w, y};
  MatMulShared(std::span(&target, 1), x, n, pool, scratch, batch_invariant);
}

namespace {

// The products of targets that all have tiles of one type and width: the activations are
// converted once (TileOps::prep; float tiles read them as they are), then every tile group of
// every target is one work item that runs the tile kernel over the tokens in slices of
// kMaxTileTokens while its weights stay in cache.
void TiledProducts(std::span<const MatMulTarget> targets, const float* x, int64_t n,
                   ThreadPool& pool, std::vector<uint8_t>& scratch) {
  const TiledMatrix& m0 = *targets[0].w->tiles;
  const TileOps* ops = TileOpsFor(m0.type());
  assert(ops != nullptr);
  const int64_t cols = m0.cols();
  // Activations of token t at act_base + t * nb elements of act_bytes bytes.
  const uint8_t* act_base = reinterpret_cast<const uint8_t*>(x);
  int64_t nb = cols;
  size_t act_bytes = sizeof(float);
  if (ops->prep != nullptr) {
    nb = cols / kQK;
    act_bytes = sizeof(TileAct);
    scratch.resize(static_cast<size_t>(n * nb) * sizeof(TileAct));
    TileAct* act = reinterpret_cast<TileAct*>(scratch.data());
    auto prep = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) ops->prep(x + t * cols, cols, act + t * nb);
    };
    ForTokens(pool, n, cols, prep);
    act_base = scratch.data();
  }
  auto act = [&](int64_t t) { return act_base + static_cast<size_t>(t * nb) * act_bytes; };

  const size_t num_targets = targets.size();
  assert(num_targets <= 8);
  int64_t group_begin[8];
  int64_t groups = 0;
  for (size_t i = 0; i < num_targets; ++i) {
    group_begin[i] = groups;
    groups += targets[i].w->tiles->groups();
  }
  // At least ~64K multiply-adds per chunk (a chunk count of 1 runs inline), and a few chunks
  // per thread so that uneven progress evens out.
  const int64_t group_work = kTileRows * cols * n;
  const int64_t grain = std::max<int64_t>(
      std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, group_work)),
      groups / (4 * pool.num_threads()));
  pool.ParallelFor(groups, [&](int64_t gb, int64_t ge) {
    float part[kMaxTileTokens * kTileRows];
    size_t ti = 0;
    for (int64_t g = gb; g < ge; ++g) {
      while (ti + 1 < num_targets && g >= group_begin[ti + 1]) ++ti;
      const TiledMatrix& m = *targets[ti].w->tiles;
      const int64_t lg = g - group_begin[ti], rows = m.rows(), r0 = lg * kTileRows;
      const uint8_t* w = m.group(lg);
      float* y = targets[ti].y;
      for (int64_t t0 = 0; t0 < n; t0 += kMaxTileTokens) {
        const int count = static_cast<int>(std::min<int64_t>(kMaxTileTokens, n - t0));
        if (r0 + kTileRows <= rows) {
          ops->dot(cols, w, act(t0), nb, count, y + t0 * rows + r0, rows);
          continue;
        }
        // The last, partly padded group: only its real rows are written.
        ops->dot(cols, w, act(t0), nb, count, part, kTileRows);
        for (int c = 0; c < count; ++c)
          std::copy_n(part + c * kTileRows, rows - r0, y + (t0 + c) * rows + r0);
      }
    }
  }, grain);
}

}  // namespace

void MatMulShared(std::span<const MatMulTarget> targets, const float* x, int64_t n,
                  ThreadPool& pool, std::vector<uint8_t>& scratch, bool batch_invariant) {
  const WeightMatrix& w0 = targets[0].w->view;
  const int64_t cols = w0.cols;
  bool same = true, tiled = true;
  for (const MatMulTarget& t : targets) {
    same = same && t.w->view.type == w0.type && t.w->view.cols == cols;
    tiled = tiled && t.w->tiles != nullptr;
  }
  // Prompts that need not be batch-invariant keep BLAS for float32 weights (tiles or not).
  const bool blas = !batch_invariant && w0.type == DType::kF32 && n >= kBlasMinRows;
  if (same && tiled && !blas) return TiledProducts(targets, x, n, pool, scratch);
  if (!same || blas) {
    if (targets.size() > 1 || !same) {
      for (const MatMulTarget& t : targets) MatMulShared(std::span(&t, 1), x, n, pool, scratch,
                                                         batch_invariant);
      return;
    }
    openblas_set_num_threads(pool.num_threads());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(w0.rows), static_cast<int>(cols), 1.0f, x,
                static_cast<int>(cols), static_cast<const float*>(w0.data),
                static_cast<int>(cols), 0.0f, targets[0].y, static_cast<int>(w0.rows));
    return;
  }

  const TypeOps* ops = GetTypeOps(w0.type);
  assert(ops && ops->vec_dot);
  // Convert the activations once, then dot every weight row with them in its stored format.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  size_t act_row_bytes = static_cast<size_t>(cols) * sizeof(float);
  // Several tokens with a packed kernel: each row is also packed (in the same parallel loop),
  // after the n converted rows.
  const bool packed = n > 1 && ops->vec_dot_packed != nullptr && ops->from_float != nullptr;
  const size_t packed_row_bytes = packed ? ops->packed_bytes(cols) : 0;
  const uint8_t* act_packed = nullptr;
  if (ops->from_float != nullptr) {
    act_row_bytes = RowBytes(ops->vec_dot_type, cols);
    scratch.resize((act_row_bytes + packed_row_bytes) * n);
    uint8_t* packed_base = scratch.data() + act_row_bytes * n;
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        uint8_t* row = scratch.data() + t * act_row_bytes;
        ops->from_float(x + t * cols, row, cols);
        if (packed) ops->pack(cols, row, packed_base + t * packed_row_bytes);
      }
    }, 1);
    act = scratch.data();
    if (packed) act_packed = packed_base;
  }

  // Work unit: a strip of weight rows of one target against every token, so the strip stays in
  // cache while the tokens stream past it. Strips of all targets are numbered consecutively.
  const int64_t strip = 16;
  int64_t strip_begin[8];
  const size_t num_targets = targets.size();
  assert(num_targets <= 8);
  int64_t strips = 0;
  for (size_t i = 0; i < num_targets; ++i) {
    strip_begin[i] = strips;
    strips += (targets[i].w->view.rows + strip - 1) / strip;
  }
  auto vec_dot = ops->vec_dot;
  auto vec_dot_multi = ops->vec_dot_multi;
  auto vec_dot_rows = ops->vec_dot_rows;
  const size_t w_row_bytes = RowBytes(w0.type, cols);
  // At least ~64K multiply-adds per chunk: below that, waking another thread costs more than
  // it saves (a chunk count of 1 runs inline).
  const int64_t strip_work = strip * cols * n;
  const int64_t grain = std::max<int64_t>(
      std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, strip_work)),
      strips / (4 * pool.num_threads()));
  pool.ParallelFor(strips, [&](int64_t sb, int64_t se) {
    size_t ti = 0;
    for (int64_t s = sb; s < se; ++s) {
      while (ti + 1 < num_targets && s >= strip_begin[ti + 1]) ++ti;
      const WeightMatrix& w = targets[ti].w->view;
      const uint8_t* wdata = static_cast<const uint8_t*>(w.data);
      const int64_t rows = w.rows;
      const int64_t r0 = (s - strip_begin[ti]) * strip, r1 = std::min(rows, r0 + strip);
      int64_t t = 0;
      if (act_packed != nullptr) {
        // Several tokens per weight row read over the packed rows (each as vec_dot's, bit for bit).
        float out[kMaxPackedDot];
        for (; t < n; t += kMaxPackedDot) {
          const int count = static_cast<int>(std::min<int64_t>(kMaxPackedDot, n - t));
          const uint8_t* xp = act_packed + t * packed_row_bytes;
          float* yt = targets[ti].y + t * rows;
          for (int64_t r = r0; r < r1; ++r) {
            ops->vec_dot_packed(cols, wdata + r * w_row_bytes, xp, packed_row_bytes, count, out);
            for (int c = 0; c < count; ++c) yt[c * rows + r] = out[c];
          }
        }
      }
      if (vec_dot_multi != nullptr) {
        // Several tokens per weight row read (each result as vec_dot's, bit for bit).
        float out[kMaxMultiDot];
        for (; t + 1 < n; t += kMaxMultiDot) {
          const int count = static_cast<int>(std::min<int64_t>(kMaxMultiDot, n - t));
          const uint8_t* xa = act + t * act_row_bytes;
          float* yt = targets[ti].y + t * rows;
          for (int64_t r = r0; r < r1; ++r) {
            vec_dot_multi(cols, wdata + r * w_row_bytes, xa, act_row_bytes, count, out);
            for (int c = 0; c < count; ++c) yt[c * rows + r] = out[c];
          }
        }
      }
      for (; t < n; ++t) {
        const uint8_t* xa = act + t * act_row_bytes;
        float* yt = targets[ti].y + t * rows;
        int64_t r = r0;
        if (vec_dot_rows != nullptr) {
          // Several weight rows per activation read (each result as vec_dot's, bit for bit).
          for (; r + 1 < r1; r += 2)
            vec_dot_rows(cols, wdata + r * w_row_bytes, w_row_bytes, xa, 2, &yt[r]);
        }
        for (; r < r1; ++r) yt[r] = vec_dot(cols, wdata + r * w_row_bytes, xa);
      }
    }
  }, grain);
}

}  // namespace specinfer::cpu
