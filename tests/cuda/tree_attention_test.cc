// The tree-attention kernel against an fp64 host reference written from the contract alone
// (backend/backend.h: committed prefix + mask bits over the window; paged slots through block
// tables), over the sweep: a tree of one node, a chain, a full fan-out, 64- and 128-node
// trees, contexts that are not a multiple of the tile, GQA ratios 1/4/8, batches of 1..32,
// float32/fp16/bf16 inputs; plus the properties a chain equals causal attention, a batch equals
// each request alone, split KV equals unsplit.
#include "tree_attention.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/tree_attention_plan.h"
#include "cuda_test_util.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

using kernels::AttnType;
using testing::DeviceArray;

enum class Shape { kCausal, kChain, kFanOut, kRandomTree };

struct RequestSpec {
  int32_t tokens = 1;
  int32_t prefix = 0;
  int32_t masked = 0;  // earlier tree entries in the window (tree shapes only)
  Shape shape = Shape::kRandomTree;
  int32_t clear_row = -1;  // >= 0: that row's mask is cleared (sees only the prefix)
};

struct Problem {
  int32_t qo_heads = 8, kv_heads = 8, head_dim = 64, block_size = 16;
  AttnType type = AttnType::kF32;
  std::vector<RequestSpec> reqs;
  int32_t sliding_window = 0;  // > 0: TreeAttentionParams::sliding_window
  float softcap = 0.0f;        // > 0: TreeAttentionParams::softcap
};

// The tree over window entries (masked earlier ones, then the new tokens): parent of each entry.
std::vector<int32_t> WindowParents(const RequestSpec& r, std::mt19937& rng) {
  const int32_t w = r.masked + r.tokens;
  std::vector<int32_t> parents(static_cast<size_t>(w));
  for (int32_t j = 0; j < w; ++j) {
    switch (r.shape) {
      case Shape::kChain:
      case Shape::kCausal:
        parents[j] = j - 1;
        break;
      case Shape::kFanOut:
        parents[j] = j == 0 ? -1 : 0;
        break;
      case Shape::kRandomTree:
        parents[j] = j == 0 ? -1 : std::uniform_int_distribution<int32_t>(-1, j - 1)(rng);
        break;
    }
  }
  return parents;
}

// Rounds a float to what the kernel's input type holds.
float RoundTo(AttnType t, float v) {
  if (t == AttnType::kF16) return Fp16ToFp32(Fp32ToFp16(v));
  if (t == AttnType::kBF16) return Bf16ToFp32(Fp32ToBf16(v));
  return v;
}

// Device bytes of float values in type t.
std::vector<uint8_t> Encode(AttnType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * (t == AttnType::kF32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == AttnType::kF32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t h = t == AttnType::kF16 ? Fp32ToFp16(v[i]) : Fp32ToBf16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// One request's inputs, by logical position (the reference never sees pages).
struct RequestData {
  RequestSpec spec;
  TreeMask mask;            // [tokens, masked + tokens]; Causal(tokens) for kCausal
  std::vector<float> q;     // [tokens, qo_heads, head_dim], rounded to the input type
  std::vector<float> k, v;  // [kv_len, kv_heads, head_dim]
  int32_t kv_len() const { return spec.prefix + spec.masked + spec.tokens; }
  // New token i's position: the prefix plus its depth in the window (the entries it sees less
  // one), as the engine lays trees out.
  int32_t Position(int32_t i) const {
    int32_t seen = 0;
    for (int32_t j = 0; j < spec.masked + spec.tokens; ++j) seen += mask.Get(i, j) ? 1 : 0;
    return spec.prefix + std::max(seen, 1) - 1;
  }
};

RequestData MakeRequest(const Problem& p, const RequestSpec& rs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RequestData d;
  d.spec = rs;
  if (rs.shape == Shape::kCausal) {
    d.mask = TreeMask::Causal(rs.tokens);
  } else {
    // Rows: the new tokens; each sees its ancestors among the window and itself.
    const std::vector<int32_t> parents = WindowParents(rs, rng);
    const TreeMask full = TreeMask::FromParents(parents);
    d.mask = TreeMask::Empty(rs.tokens, rs.masked + rs.tokens);
    for (int32_t i = 0; i < rs.tokens; ++i)
      for (int32_t j = 0; j < rs.masked + rs.tokens; ++j)
        if (full.Get(rs.masked + i, j)) d.mask.Set(i, j);
  }
  if (rs.clear_row >= 0)
    for (int32_t w = 0; w < d.mask.words_per_row; ++w)
      d.mask.bits[static_cast<size_t>(rs.clear_row) * d.mask.words_per_row + w] = 0;
  d.q.resize(static_cast<size_t>(rs.tokens) * p.qo_heads * p.head_dim);
  d.k.resize(static_cast<size_t>(d.kv_len()) * p.kv_heads * p.head_dim);
  d.v.resize(d.k.size());
  for (float& x : d.q) x = RoundTo(p.type, normal(rng));
  for (float& x : d.k) x = RoundTo(p.type, normal(rng));
  for (float& x : d.v) x = RoundTo(p.type, normal(rng));
  return d;
}

struct Result {
  std::vector<float> got;  // [tokens, qo_heads, head_dim]
  std::vector<double> want;
  bool any_split = false;
  int32_t spread_items = 0;  // the plan's (TreeAttentionPlan::spread_items)
};

// fp64 reference from the contract: the visible positions are the prefix and the window
// entries whose mask bit is set; softmax(scale q.k) v over them; zeros if none. With a sliding
// window W, only the keys of the token's virtual sequence (prefix, then its window entries,
// compacted) at index v >= position - W + 1.
std::vector<double> Reference(const Problem& p, const std::vector<RequestData>& reqs) {
  const int32_t hd = p.head_dim, group = p.qo_heads / p.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out;
  for (const RequestData& d : reqs) {
    const RequestSpec& rs = d.spec;
    for (int32_t i = 0; i < rs.tokens; ++i) {
      std::vector<int32_t> visible;
      for (int32_t pos = 0; pos < rs.prefix; ++pos) visible.push_back(pos);
      for (int32_t j = 0; j < rs.masked + rs.tokens; ++j)
        if (d.mask.Get(i, j)) visible.push_back(rs.prefix + j);
      if (p.sliding_window > 0) {
        const int32_t first = d.Position(i) - p.sliding_window + 1;
        visible.erase(
            visible.begin(),
            visible.begin() + std::clamp<int32_t>(first, 0, static_cast<int32_t>(visible.size())));
      }
      for (int32_t h = 0; h < p.qo_heads; ++h) {
        const int32_t kvh = h / group;
        const float* qh = &d.q[(static_cast<size_t>(i) * p.qo_heads + h) * hd];
        std::vector<double> sc(visible.size());
        double mx = -INFINITY;
        for (size_t a = 0; a < visible.size(); ++a) {
          const float* kh = &d.k[(static_cast<size_t>(visible[a]) * p.kv_heads + kvh) * hd];
          double s = 0;
          for (int32_t e = 0; e < hd; ++e) s += static_cast<double>(qh[e]) * kh[e];
          sc[a] = s * scale;
          if (p.softcap > 0.0f) sc[a] = p.softcap * std::tanh(sc[a] / p.softcap);
          mx = std::max(mx, sc[a]);
        }
        double sum = 0;
        for (double& s : sc) sum += (s = std::exp(s - mx));
        std::vector<double> o(static_cast<size_t>(hd), 0.0);
        for (size_t a = 0; a < visible.size(); ++a) {
          const float* vh = &d.v[(static_cast<size_t>(visible[a]) * p.kv_heads + kvh) * hd];
          for (int32_t e = 0; e < hd; ++e) o[e] += sc[a] / sum * vh[e];
        }
        out.insert(out.end(), o.begin(), o.end());
      }
    }
  }
  return out;
}

// Lays the requests out in a paged cache (blocks a random permutation: scattered pages), plans
// (partial_capacity 0: never split; fixed_chunk > 0: that chunk; spread: spread_windows) and runs
// the kernel.
Result RunKernel(const Problem& p, const std::vector<RequestData>& data, uint32_t page_seed,
                 int64_t partial_capacity, int32_t fixed_chunk, bool out_float,
                 bool spread = true) {
  std::mt19937 rng(page_seed);
  const int32_t hd = p.head_dim, bs = p.block_size;
  int32_t total_tokens = 0, total_blocks = 0;
  for (const RequestData& d : data) {
    total_blocks += (d.kv_len() + bs - 1) / bs;
    total_tokens += d.spec.tokens;
  }
  std::vector<int32_t> perm(static_cast<size_t>(total_blocks) + 3);  // a few unused blocks
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t slots = static_cast<int64_t>(perm.size()) * bs;
  const size_t row = static_cast<size_t>(p.kv_heads) * hd;

  std::vector<kernels::TreeAttentionRequest> reqs;
  std::vector<int32_t> tables;
  std::vector<uint64_t> words;
  std::vector<float> q, kc(static_cast<size_t>(slots) * row, 0.0f), vc(kc.size(), 0.0f);
  std::vector<int32_t> positions;
  int32_t token = 0, block = 0;
  for (const RequestData& d : data) {
    kernels::TreeAttentionRequest r;
    r.token_begin = token;
    r.token_count = d.spec.tokens;
    r.kv_prefix = d.spec.prefix;
    r.masked_kv = d.spec.masked;
    r.block_table_begin = static_cast<int32_t>(tables.size());
    const int32_t nb = (d.kv_len() + bs - 1) / bs;
    for (int32_t b = 0; b < nb; ++b) tables.push_back(perm[static_cast<size_t>(block++)]);
    if (d.spec.shape == Shape::kCausal) {
      r.mask_begin = -1;
    } else {
      r.mask_words_per_row = d.mask.words_per_row;
      r.mask_begin = static_cast<int64_t>(words.size());
      words.insert(words.end(), d.mask.bits.begin(), d.mask.bits.end());
    }
    for (int32_t pos = 0; pos < d.kv_len(); ++pos) {
      const int64_t slot =
          static_cast<int64_t>(tables[r.block_table_begin + pos / bs]) * bs + pos % bs;
      std::copy_n(&d.k[pos * row], row, &kc[static_cast<size_t>(slot) * row]);
      std::copy_n(&d.v[pos * row], row, &vc[static_cast<size_t>(slot) * row]);
    }
    q.insert(q.end(), d.q.begin(), d.q.end());
    for (int32_t i = 0; i < d.spec.tokens; ++i) positions.push_back(d.Position(i));
    reqs.push_back(r);
    token += d.spec.tokens;
  }

  cuda::TreeAttentionPlanOptions po;
  po.qo_heads = p.qo_heads;
  po.kv_heads = p.kv_heads;
  po.head_dim = hd;
  po.target_blocks = 264;
  po.partial_capacity_rows = partial_capacity;
  po.fixed_chunk = fixed_chunk;
  po.rows_per_item = kernels::TreeAttentionRowsPerItem(p.type, hd);
  po.spread_windows = spread;
  auto plan = cuda::PlanTreeAttention(reqs, po);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  Result res;
  if (!plan.ok()) return res;
  res.any_split = plan->any_split;
  res.spread_items = plan->spread_items;

  const size_t out_elems = q.size();
  DeviceArray<uint8_t> dq(Encode(p.type, q)), dk(Encode(p.type, kc)), dv(Encode(p.type, vc));
  DeviceArray<int32_t> dtables(tables), dtreq(plan->token_request), dpos(positions);
  DeviceArray<uint64_t> dwords(words.empty() ? std::vector<uint64_t>{0} : words);
  std::vector<uint8_t> req_bytes(reqs.size() * sizeof(reqs[0]));
  std::memcpy(req_bytes.data(), reqs.data(), req_bytes.size());
  std::vector<uint8_t> work_bytes(plan->work.size() * sizeof(plan->work[0]));
  std::memcpy(work_bytes.data(), plan->work.data(), work_bytes.size());
  DeviceArray<uint8_t> dreqs(req_bytes), dwork(work_bytes);
  const bool f32_out = out_float || p.type == AttnType::kF32;
  DeviceArray<uint8_t> dout(out_elems * (f32_out ? 4 : 2));
  DeviceArray<float> pout(static_cast<size_t>(std::max<int64_t>(plan->partial_rows, 1)) * hd);
  DeviceArray<float> pml(static_cast<size_t>(std::max<int64_t>(plan->partial_rows, 1)) * 2);

  kernels::TreeAttentionParams kp;
  kp.q = dq.get();
  kp.k_cache = dk.get();
  kp.v_cache = dv.get();
  kp.out = dout.get();
  kp.block_tables = dtables.get();
  kp.mask_words = dwords.get();
  kp.requests = reinterpret_cast<const kernels::TreeAttentionRequest*>(dreqs.get());
  kp.work = reinterpret_cast<const kernels::TreeAttentionWorkItem*>(dwork.get());
  kp.token_request = dtreq.get();
  kp.partial_out = pout.get();
  kp.partial_ml = pml.get();
  kp.num_tokens = total_tokens;
  kp.num_work = static_cast<int32_t>(plan->work.size());
  kp.qo_heads = p.qo_heads;
  kp.kv_heads = p.kv_heads;
  kp.head_dim = hd;
  kp.block_size = bs;
  kp.kv_chunk = plan->kv_chunk;
  kp.rows_per_item = plan->rows_per_item;
  kp.max_window = plan->max_window;
  kp.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  kp.any_split = plan->any_split;
  kp.sliding_window = p.sliding_window;
  kp.softcap = p.softcap;
  kp.positions = dpos.get();
  const cudaError_t err = kernels::LaunchTreeAttention(kp, p.type, out_float, nullptr);
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  const std::vector<uint8_t> raw = dout.Download();
  res.got.resize(out_elems);
  for (size_t i = 0; i < out_elems; ++i) {
    if (f32_out) {
      std::memcpy(&res.got[i], &raw[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &raw[i * 2], 2);
      res.got[i] = p.type == AttnType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
  return res;
}

std::vector<RequestData> MakeAll(const Problem& p, uint32_t seed) {
  std::vector<RequestData> data;
  for (size_t i = 0; i < p.reqs.size(); ++i)
    data.push_back(MakeRequest(p, p.reqs[i], seed * 1000 + static_cast<uint32_t>(i)));
  return data;
}

// Node i of `tree` (a request without masked entries) as a decode step of its own: the committed
// prefix, then the window entries node i sees (its ancestors and itself), in order, and its query.
RequestData PathOf(const Problem& p, const RequestData& tree, int32_t i) {
  const size_t row = static_cast<size_t>(p.kv_heads) * p.head_dim;
  const size_t qrow = static_cast<size_t>(p.qo_heads) * p.head_dim;
  const int32_t prefix = tree.spec.prefix;
  RequestData path;
  path.k.assign(tree.k.begin(), tree.k.begin() + prefix * row);
  path.v.assign(tree.v.begin(), tree.v.begin() + prefix * row);
  int32_t seen = 0;
  for (int32_t j = 0; j < tree.spec.tokens; ++j) {
    if (!tree.mask.Get(i, j)) continue;
    path.k.insert(path.k.end(), tree.k.begin() + (prefix + j) * row,
                  tree.k.begin() + (prefix + j + 1) * row);
    path.v.insert(path.v.end(), tree.v.begin() + (prefix + j) * row,
                  tree.v.begin() + (prefix + j + 1) * row);
    ++seen;
  }
  path.spec = {1, prefix + seen - 1, 0, Shape::kCausal};
  path.mask = TreeMask::Causal(1);
  path.q.assign(tree.q.begin() + i * qrow, tree.q.begin() + (i + 1) * qrow);
  return path;
}

// Builds random inputs for `p`, runs the kernel and the fp64 reference.
Result RunCase(const Problem& p, uint32_t seed, int64_t partial_capacity, int32_t fixed_chunk = 0,
               bool out_float = true) {
  const std::vector<RequestData> data = MakeAll(p, seed);
  Result r = RunKernel(p, data, seed + 1, partial_capacity, fixed_chunk, out_float);
  r.want = Reference(p, data);
  return r;
}

double Tolerance(AttnType t, bool out_float) {
  if (out_float || t == AttnType::kF32) return 2e-5;
  return t == AttnType::kF16 ? 1e-3 : 1e-2;
}

std::string Describe(const Problem& p) {
  std::string s = "heads " + std::to_string(p.qo_heads) + "/" + std::to_string(p.kv_heads) +
                  " hd " + std::to_string(p.head_dim) + " bs " + std::to_string(p.block_size) +
                  " type " + std::to_string(static_cast<int>(p.type)) + " reqs";
  for (const RequestSpec& r : p.reqs)
    s += " [" + std::to_string(r.tokens) + " tok, prefix " + std::to_string(r.prefix) +
         ", masked " + std::to_string(r.masked) + ", shape " +
         std::to_string(static_cast<int>(r.shape)) + "]";
  return s.size() > 600 ? s.substr(0, 600) + "..." : s;
}

void Check(const Problem& p, uint32_t seed, int64_t partial_capacity = 1 << 22,
           bool out_float = true) {
  const Result r = RunCase(p, seed, partial_capacity, 0, out_float);
  const double tol = Tolerance(p.type, out_float);
  EXPECT_ALL_CLOSE(r.got, r.want, tol, tol, Describe(p));
}

// The sweep of the issue: tree shapes x context lengths x GQA ratios x types.
// On the emulator (hundreds of times slower than a GPU; all 648 problems took 7 minutes of a CI
// core) a covering subset: every pair of values of any two of the five dimensions, and every
// type x heads x head size, in 72 problems (two choices of type, heads and head size per
// prefix and shape). A GPU runs them all.
bool InEmulatorSubset(int32_t type, int32_t heads, int32_t hd, int32_t prefix, int32_t shape) {
  for (int32_t r = 0; r < 2; ++r) {
    if (type == (prefix + shape + r) % 3 && heads == (prefix + 2 * shape + 2 * r) % 3 &&
        hd == (prefix + shape / 2 + shape + r) % 2)
      return true;
  }
  return false;
}

TEST(CudaTreeAttention, MatchesReferenceOverShapeSweep) {
  uint32_t seed = 100;
  const struct { int32_t qo, kv; } heads[] = {{8, 8}, {8, 2}, {32, 4}};  // GQA ratios 1, 4, 8
  const AttnType types[] = {AttnType::kF32, AttnType::kF16, AttnType::kBF16};
  const int32_t head_dims[] = {64, 128};
  const int32_t prefixes[] = {0, 1, 31, 33, 100, 1000};
  const std::pair<int32_t, Shape> shapes[] = {{1, Shape::kRandomTree},   {7, Shape::kChain},
                                              {9, Shape::kFanOut},       {64, Shape::kRandomTree},
                                              {128, Shape::kRandomTree}, {45, Shape::kCausal}};
  int32_t checked = 0;
  for (int32_t ti = 0; ti < 3; ++ti) {
    for (int32_t hi = 0; hi < 3; ++hi) {
      for (int32_t di = 0; di < 2; ++di) {
        for (int32_t pi = 0; pi < 6; ++pi) {
          for (int32_t si = 0; si < 6; ++si) {
            const auto& h = heads[hi];
            const auto [tokens, shape] = shapes[si];
            const int32_t prefix = prefixes[pi];
            ++seed;  // the same problem gets the same data on a GPU and the emulator
            if (testing::kEmulated && !InEmulatorSubset(ti, hi, di, pi, si)) continue;
            if (tokens >= 64 && prefix == 1000 && h.qo == 32)
              continue;  // keep the fp64 reference quick
            Problem p;
            p.qo_heads = h.qo;
            p.kv_heads = h.kv;
            p.head_dim = head_dims[di];
            p.type = types[ti];
            p.reqs = {{tokens, prefix, 0, shape}};
            Check(p, seed);
            ++checked;
          }
        }
      }
    }
  }
  std::printf("  %d problems checked\n", checked);
}

// Many requests at once, of mixed kinds (decode, prefill chunk, tree, masked tree levels), with
// batch sizes 1..32.
TEST(CudaTreeAttention, MatchesReferenceForMixedBatches) {
  std::mt19937 rng(7);
  uint32_t seed = 500;
  for (int32_t batch : {1, 2, 3, 8, 17, 32}) {
    for (int32_t block_size : {16, 7}) {
      Problem p;
      p.qo_heads = 12;
      p.kv_heads = 3;
      p.head_dim = 64;
      p.block_size = block_size;
      p.type = batch % 2 ? AttnType::kF16 : AttnType::kF32;
      for (int32_t b = 0; b < batch; ++b) {
        RequestSpec r;
        r.prefix = std::uniform_int_distribution<int32_t>(0, 700)(rng);
        switch (b % 4) {
          case 0:
            r.tokens = 1;
            r.shape = Shape::kRandomTree;
            break;  // decode
          case 1:
            r.tokens = 1 + b % 37;
            r.shape = Shape::kCausal;
            break;  // prefill
          case 2:
            r.tokens = 2 + b % 23;
            r.shape = Shape::kRandomTree;
            break;  // tree
          case 3:
            r.tokens = 3;
            r.masked = 5 + b % 9;
            r.shape = Shape::kRandomTree;
            break;
        }
        p.reqs.push_back(r);
      }
      Check(p, seed++);
    }
  }
}

// Odd head sizes (stories260K has head_dim 8), head_dim 256, and the 16-bit output type.
TEST(CudaTreeAttention, MatchesReferenceForOddHeadSizesAndHalfOutput) {
  uint32_t seed = 900;
  for (int32_t hd : {6, 8, 24, 96, 256}) {  // 6: the scalar K/V load path
    Problem p;
    p.qo_heads = 8;
    p.kv_heads = 4;
    p.head_dim = hd;
    p.reqs = {{5, 40, 0, Shape::kRandomTree}, {1, 3, 0, Shape::kChain}, {17, 0, 0, Shape::kCausal}};
    Check(p, seed++);
  }
  for (AttnType type : {AttnType::kF16, AttnType::kBF16}) {
    Problem p;
    p.qo_heads = 16;
    p.kv_heads = 2;
    p.head_dim = 128;
    p.type = type;
    p.reqs = {{33, 500, 0, Shape::kRandomTree}, {1, 2000, 0, Shape::kRandomTree}};
    Check(p, seed++, 1 << 22, /*out_float=*/false);
  }
}

// A row that sees nothing (an all-clear mask row and no prefix) gets zeros; with a prefix it
// sees the prefix only.
TEST(CudaTreeAttention, FullyMaskedRowIsZero) {
  for (int32_t prefix : {0, 20}) {
    Problem p;
    p.qo_heads = 4;
    p.kv_heads = 2;
    p.head_dim = 32;
    p.reqs = {{6, prefix, 0, Shape::kRandomTree, /*clear_row=*/3}};
    const Result r = RunCase(p, 3, 0);
    EXPECT_ALL_CLOSE(r.got, r.want, 2e-5, 2e-5, "prefix " + std::to_string(prefix));
    if (prefix == 0) {
      const size_t row = static_cast<size_t>(p.qo_heads) * p.head_dim;
      for (size_t i = 3 * row; i < 4 * row; ++i) ASSERT_EQ(r.got[i], 0.0f) << i;
    }
  }
}

// Long contexts with little work are split into chunks; the merged result equals the unsplit one
// (within float rounding) and the reference.
TEST(CudaTreeAttention, SplitKvEqualsUnsplit) {
  for (int32_t ctx : {513, 4097, 8191}) {
    Problem p;
    p.qo_heads = 8;  // 4 query heads per KV head, as Llama-3-8B (fewer heads: emulator time)
    p.kv_heads = 2;
    p.head_dim = 128;
    p.type = AttnType::kF16;
    p.reqs = {{1, ctx, 0, Shape::kRandomTree}, {4, ctx / 3, 0, Shape::kChain}};
    const Result split = RunCase(p, 42, 1 << 22);
    const Result whole = RunCase(p, 42, 0);
    EXPECT_TRUE(split.any_split) << "ctx " << ctx;
    EXPECT_FALSE(whole.any_split);
    EXPECT_ALL_CLOSE(split.got, whole.got, 1e-5, 1e-5,
                     "split vs whole, ctx " + std::to_string(ctx));
    EXPECT_ALL_CLOSE(split.got, split.want, 2e-5, 2e-5, "split vs reference");
    // A fixed chunk (the runner's batch-invariant policy) gives the same.
    const Result fixed = RunCase(p, 42, 1 << 22, 512);
    EXPECT_ALL_CLOSE(fixed.got, split.want, 2e-5, 2e-5, "fixed chunk vs reference");
  }
}

// A tree that is a single chain, given as mask bits, equals causal attention (mask == null)
// bit for bit.
// With 16-bit inputs (the tensor-core kernel) the chain's rows are gathered token by token
// into their warps' own tiles, the causal rows read shared tiles: the same bits.
TEST(CudaTreeAttention, ChainTreeEqualsCausal) {
  for (AttnType type : {AttnType::kF32, AttnType::kF16, AttnType::kBF16}) {
    for (int32_t prefix : {0, 5, 300}) {
      for (int32_t tokens : {1, 2, 31, 64, 100}) {
        Problem p;
        p.qo_heads = 8;
        p.kv_heads = 2;
        p.head_dim = 64;
        p.type = type;
        p.reqs = {{tokens, prefix, 0, Shape::kChain}};
        const Result chain = RunCase(p, 77, 0);
        p.reqs[0].shape = Shape::kCausal;
        const Result causal = RunCase(p, 77, 0);
        EXPECT_ALL_CLOSE(chain.got, causal.got, 0.0, 0.0,
                         "prefix " + std::to_string(prefix) + " tokens " + std::to_string(tokens) +
                             " type " + std::to_string(static_cast<int>(type)));
      }
    }
  }
}

// A window too large for the tensor-core kernel's shared memory (head_dim 128: about 390 rows)
// is gathered token by token from global memory instead: still the causal result bit for bit,
// and the reference's.
TEST(CudaTreeAttention, WindowLargerThanSharedMemoryEqualsCausal) {
  Problem p;
  p.qo_heads = 2;
  p.kv_heads = 1;
  p.head_dim = 128;
  p.type = AttnType::kF16;
  p.reqs = {{400, 7, 0, Shape::kChain}};
  const Result chain = RunCase(p, 88, 0);
  EXPECT_ALL_CLOSE(chain.got, chain.want, 2e-5, 2e-5, "chain vs reference");
  p.reqs[0].shape = Shape::kCausal;
  const Result causal = RunCase(p, 88, 0);
  EXPECT_ALL_CLOSE(chain.got, causal.got, 0.0, 0.0, "chain vs causal");
}

// Every node of a tree gets bit for bit what it gets when its root-to-node path is decoded one
// token at a time (the path's earlier nodes committed, the node alone with a causal mask): the
// property that keeps speculative greedy output equal to incremental output. With and without
// KV chunks (a fixed chunk of 64 puts chunk boundaries inside the path).
// Also on tensor cores (fp16, bf16), with 3 query heads per KV head (a token's rows then cross
// the warps' 16-row boundaries) and head_dim 128.
TEST(CudaTreeAttention, TreeNodeEqualsItsPathDecodedOneByOne) {
  struct Heads {
    int32_t qo, kv, hd;
  };
  for (AttnType type : {AttnType::kF32, AttnType::kF16, AttnType::kBF16}) {
    for (int32_t prefix : {0, 45, 100, 300}) {
      const Heads heads = prefix == 45    ? Heads{9, 3, 64}
                          : prefix == 100 ? Heads{4, 4, 128}
                                          : Heads{8, 2, 64};
      Problem p;
      p.qo_heads = heads.qo;
      p.kv_heads = heads.kv;
      p.head_dim = heads.hd;
      p.type = type;
      p.reqs = {{40, prefix, 0, Shape::kRandomTree}};
      const RequestData tree = MakeAll(p, 21 + prefix)[0];
      const size_t qrow = static_cast<size_t>(p.qo_heads) * p.head_dim;
      for (int32_t fixed : {0, 64}) {
        const int64_t cap = fixed ? 1 << 20 : 0;
        const Result whole = RunKernel(p, {tree}, 3, cap, fixed, true);
        for (int32_t i = 0; i < 40; ++i) {
          const RequestData path = PathOf(p, tree, i);
          Problem one = p;
          one.reqs = {path.spec};
          const Result alone = RunKernel(one, {path}, 9 + i, cap, fixed, true);
          const std::vector<float> node(whole.got.begin() + i * qrow,
                                        whole.got.begin() + (i + 1) * qrow);
          EXPECT_ALL_CLOSE(alone.got, node, 0.0, 0.0,
                           "node " + std::to_string(i) + " prefix " + std::to_string(prefix) +
                               " chunk " + std::to_string(fixed) + " type " +
                               std::to_string(static_cast<int>(type)));
        }
      }
    }
  }
}

// Sliding windows (Mistral, Gemma): each token sees only the last W keys of its virtual sequence
// (its position less W plus one onwards), on both kernels (float32: CUDA cores; fp16/bf16 with
// head_dim 64: tensor cores; fp16 head_dim 32: CUDA cores), for decode, causal chunks, chains
// and trees in one batch, windows narrower than a tile, straddling tiles and wider than the
// prefix, unsplit and in fixed chunks of 64 (whole chunks masked for some rows); with the window
// of 33 also Gemma 2's soft-capping of the scores (cap 1.5: most scores are bent).
// (Soft-capped scores round differently from the fp64 reference only by tanhf.)
TEST(CudaTreeAttention, SlidingWindowMatchesReference) {
  uint32_t seed = 900;
  const struct {
    AttnType type;
    int32_t hd;
  } kinds[] = {
      {AttnType::kF32, 64}, {AttnType::kF16, 64}, {AttnType::kBF16, 64}, {AttnType::kF16, 32}};
  for (const auto& kind : kinds) {
    for (int32_t window : {1, 7, 33, 100, 500}) {
      for (int32_t fixed : {0, 64}) {
        Problem p;
        p.qo_heads = 6;
        p.kv_heads = 2;
        p.head_dim = kind.hd;
        p.type = kind.type;
        p.sliding_window = window;
        p.softcap = window == 33 ? 1.5f : 0.0f;  // Gemma 2 caps its scores and slides
        p.reqs = {{1, 300, 0, Shape::kRandomTree},
                  {45, 100, 0, Shape::kCausal},
                  {9, 60, 3, Shape::kRandomTree},
                  {7, 20, 0, Shape::kChain}};
        const Result r = RunCase(p, ++seed, fixed ? 1 << 22 : 0, fixed);
        const double tol = Tolerance(p.type, true);
        EXPECT_ALL_CLOSE(r.got, r.want, tol, tol,
                         "window " + std::to_string(window) + " chunk " + std::to_string(fixed) +
                             " " + Describe(p));
      }
    }
  }
}

// Keys before every row's sliding window are not read: NaN in their K and V (which a masked key's
// zero weight would still carry into the output: 0 x NaN) leaves every row equal to the
// reference, on both kernels, for a decoding token, a causal chunk and a tree over a long
// prefix, unsplit and in fixed chunks of 256 (the first chunks then lie wholly before the window).
TEST(CudaTreeAttention, KeysBeforeTheSlidingWindowAreNotRead) {
  const struct {
    AttnType type;
    int32_t hd;
  } kinds[] = {{AttnType::kF32, 64}, {AttnType::kF16, 64}, {AttnType::kF16, 32}};
  for (const auto& kind : kinds) {
    for (int32_t fixed : {0, 256}) {
      Problem p;
      p.qo_heads = 4;
      p.kv_heads = 2;
      p.head_dim = kind.hd;
      p.type = kind.type;
      p.sliding_window = 100;
      p.reqs = {{1, 1000, 0, Shape::kRandomTree},
                {20, 1000, 0, Shape::kCausal},
                {16, 1000, 0, Shape::kRandomTree}};
      std::vector<RequestData> data = MakeAll(p, 61);
      // Every row's window begins at 901 or later (positions 1000 and on): keys before the tile
      // holding 901 are never visible.
      const size_t row = static_cast<size_t>(p.kv_heads) * p.head_dim;
      for (RequestData& d : data) {
        std::fill_n(d.k.begin(), 896 * row, std::nanf(""));
        std::fill_n(d.v.begin(), 896 * row, std::nanf(""));
      }
      const Result r = RunKernel(p, data, 62, fixed ? 1 << 22 : 0, fixed, true);
      const double tol = Tolerance(p.type, true);
      EXPECT_ALL_CLOSE(r.got, Reference(p, data), tol, tol,
                       "chunk " + std::to_string(fixed) + " " + Describe(p));
    }
  }
}

// With a sliding window a tree node still gets bit for bit what decoding its path one token at a
// time gets (the window cuts both at the same key).
TEST(CudaTreeAttention, SlidingWindowTreeNodeEqualsItsPathDecoded) {
  for (AttnType type : {AttnType::kF32, AttnType::kF16}) {
    Problem p;
    p.qo_heads = 9;
    p.kv_heads = 3;
    p.head_dim = 64;
    p.type = type;
    p.sliding_window = 70;
    p.reqs = {{16, 150, 0, Shape::kRandomTree}};
    const RequestData tree = MakeAll(p, 31)[0];
    const size_t qrow = static_cast<size_t>(p.qo_heads) * p.head_dim;
    const Result whole = RunKernel(p, {tree}, 3, 0, 0, true);
    for (int32_t i = 0; i < 16; ++i) {
      const RequestData path = PathOf(p, tree, i);
      Problem one = p;
      one.reqs = {path.spec};
      const Result alone = RunKernel(one, {path}, 9 + i, 0, 0, true);
      const std::vector<float> node(whole.got.begin() + i * qrow,
                                    whole.got.begin() + (i + 1) * qrow);
      EXPECT_ALL_CLOSE(
          alone.got, node, 0.0, 0.0,
          "node " + std::to_string(i) + " type " + std::to_string(static_cast<int>(type)));
    }
  }
}

// Spread items (a tree's window chunks cut into 16-row items, 4 rows per warp: tensor cores,
// fewer than 4 query heads per KV head) give every row the bits the 64-row items give, and the
// reference's result: one KV head per query head, 2 and 3 (a token's rows cross the warps' 4-row
// boundaries), fp16 and bf16, unsplit and in fixed chunks of 256 (prefix 250: the window's first
// tile, at 224, lies in the first chunk, so both chunks are spread), beside a decoding token and
// a causal chunk, and a tree with masked entries.
TEST(CudaTreeAttention, SpreadWindowItemsEqualWholeItems) {
  struct Heads {
    int32_t qo, kv, hd;
  };
  uint32_t seed = 1300;
  const struct {
    Heads heads;
    AttnType type;
  } cases[] = {
      {{4, 4, 128}, AttnType::kF16}, {{8, 4, 64}, AttnType::kBF16}, {{9, 3, 64}, AttnType::kF16}};
  for (const auto& [heads, type] : cases) {
    {
      for (int32_t fixed : {0, 256}) {
        Problem p;
        p.qo_heads = heads.qo;
        p.kv_heads = heads.kv;
        p.head_dim = heads.hd;
        p.type = type;
        p.reqs = {{64, 250, 0, Shape::kRandomTree},
                  {1, 90, 0, Shape::kRandomTree},
                  {20, 33, 0, Shape::kCausal},
                  {11, 40, 6, Shape::kRandomTree}};
        const std::vector<RequestData> data = MakeAll(p, ++seed);
        const int64_t cap = fixed ? 1 << 22 : 0;
        const Result spread = RunKernel(p, data, 4, cap, fixed, true, true);
        const Result whole = RunKernel(p, data, 4, cap, fixed, true, false);
        const std::string what = "heads " + std::to_string(heads.qo) + "/" +
                                 std::to_string(heads.kv) + " chunk " + std::to_string(fixed) +
                                 " type " + std::to_string(static_cast<int>(type));
        EXPECT_GT(spread.spread_items, 0) << what;
        EXPECT_EQ(whole.spread_items, 0) << what;
        EXPECT_ALL_CLOSE(spread.got, whole.got, 0.0, 0.0, "spread vs whole, " + what);
        EXPECT_ALL_CLOSE(spread.got, Reference(p, data), 2e-5, 2e-5,
                         "spread vs reference, " + what);
      }
    }
  }
}

// Each request of a batch gets bit-identical results to running it alone (without splitting, or
// with the runner's fixed chunk; pages laid out differently).
TEST(CudaTreeAttention, BatchedEqualsOneRequest) {
  for (AttnType type : {AttnType::kF32, AttnType::kF16}) {
    Problem p;
    p.qo_heads = 8;
    p.kv_heads = 4;
    p.head_dim = 64;
    p.type = type;
    p.reqs = {{1, 900, 0, Shape::kRandomTree},
              {16, 40, 0, Shape::kRandomTree},
              {30, 0, 0, Shape::kCausal},
              {3, 200, 4, Shape::kRandomTree}};
    const std::vector<RequestData> data = MakeAll(p, 5);
    for (int32_t fixed : {0, 256}) {
      const int64_t cap = fixed ? 1 << 22 : 0;
      const Result batch = RunKernel(p, data, 6, cap, fixed, true);
      EXPECT_ALL_CLOSE(batch.got, Reference(p, data), 2e-5, 2e-5, "batch");
      size_t offset = 0;
      for (size_t i = 0; i < data.size(); ++i) {
        Problem one = p;
        one.reqs = {p.reqs[i]};
        const Result alone =
            RunKernel(one, {data[i]}, 7 + static_cast<uint32_t>(i), cap, fixed, true);
        const std::vector<float> part(batch.got.begin() + offset,
                                      batch.got.begin() + offset + alone.got.size());
        EXPECT_ALL_CLOSE(alone.got, part, 0.0, 0.0,
                         "request " + std::to_string(i) + " fixed chunk " + std::to_string(fixed) +
                             " type " + std::to_string(static_cast<int>(type)));
        offset += alone.got.size();
      }
    }
  }
}

}  // namespace
}  // namespace specinfer
