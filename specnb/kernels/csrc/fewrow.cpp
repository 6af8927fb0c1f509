// Few-row linear layers and exact decoding attention for CPUs, as a PyTorch C++ extension.
//
// A decoding or verification call multiplies 1..a few hundred rows by every weight of the model. That is
// bound by reading the weights, so verifying a draft should cost about what one token costs. BLAS / oneDNN
// are tuned for large M: for a few rows they reach ~45% of the memory bandwidth in bf16 and a 16-row call
// costs ~1.6x one row. Here each thread takes a slice of weight rows and multiplies every input row with
// four weight rows while they sit in L1, so each weight is read from memory once per call.
//
// Rows are bit-independent: every output element is computed by the same instruction sequence whatever the
// number of rows M and wherever its row sits in a block (lane-wise accumulation over K in order, one fixed
// horizontal sum, bias added in fp32, one rounding to the output dtype). So the logits of a verified draft
// are bit-identical to those of decoding its tokens one at a time, in bf16 as in fp32.
//
// The attention below has the same property: for each query it visits exactly the keys it may see, in cache
// order, so a query in a tree-verification call (extra masked keys, other queries beside it) computes what
// the same query computes alone at decoding time.
//
// Paths (chosen by the caller from the CPU flags, see specnb/kernels/cpu.py):
//   ISA_AVX2        fp32 FMA; bf16 weights widened to fp32 in registers
//   ISA_AVX512BF16  bf16 x bf16 -> fp32 dot products with vdpbf16ps (fp32 weights use the AVX2 path)
// Threads: ATen's intra-op pool (at::parallel_for), the one torch.set_num_threads controls.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int ISA_AVX2 = 0;
constexpr int ISA_AVX512BF16 = 1;
constexpr int NB = 4;  // weight rows per block
constexpr int MB = 4;  // input rows per block
constexpr int PREFETCH_ROWS = 8;  // weight rows ahead that the bf16 path prefetches (two blocks)

using bf16 = uint16_t;

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 bf16 -> 8 fp32 (exact: a bf16 is the top half of an fp32)
inline __m256 widen8(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float widen1(bf16 h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void store(float* y, float v) { *y = v; }
inline void store(at::BFloat16* y, float v) { *y = at::BFloat16(v); }  // round to nearest even

// ------------------------------------------------------------------------------------- AVX2 + FMA

template <typename W>
inline __m256 load8(const W* p);
template <>
inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
inline __m256 load8<bf16>(const bf16* p) { return widen8(p); }

inline float scalar(float v) { return v; }
inline float scalar(bf16 v) { return widen1(v); }

// y[m, j] for m < mb, j < nb: x [mb, K] (row stride K) times w [nb, K]; fp32 accumulation, 8 lanes.
// bf16 inputs arrive widened to fp32 once per call (exact), so only the weights are widened here.
template <typename TX, typename TW, int mb, int nb, typename Out>
void block_avx2(const TX* x, const TW* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  __m256 acc[mb][nb];
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++)
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) acc[m][j] = _mm256_setzero_ps();
  const int64_t k8 = K & ~int64_t(7);
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 wv[nb];
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) wv[j] = load8<TW>(w + j * K + k);
#pragma GCC unroll 16
    for (int m = 0; m < mb; m++) {
      __m256 xv = load8<TX>(x + m * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < nb; j++) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  float sums[mb][nb];
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++)
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) sums[m][j] = hsum256(acc[m][j]);
  for (int m = 0; m < mb; m++)
    for (int j = 0; j < nb; j++) {
      float s = sums[m][j];
      for (int64_t k = k8; k < K; k++) s = std::fmaf(scalar(x[m * K + k]), scalar(w[j * K + k]), s);
      store(y + m * ldy + j, bias ? s + bias[j] : s);
    }
}

// --------------------------------------------------------------------------------- AVX512-BF16

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

AVX512BF16 __attribute__((always_inline)) inline __m512bh load32(const bf16* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// Same contract as block_avx2 for bf16 operands: 16 fp32 lanes, each lane a running sum of pairs (vdpbf16ps)
// over the full 32-element chunks of K in order, then K's tail with a masked load (zeros add nothing), one
// fixed horizontal sum. The loops over m and j are unrolled so the accumulators live in registers.
template <int mb, int nb>
AVX512BF16 __attribute__((always_inline)) inline void step_bf16(__m512 (&acc)[mb][nb], const bf16* x, const bf16* w,
                                                                int64_t K, int64_t k, __mmask32 mask) {
  __m512bh wv[nb];
#pragma GCC unroll 16
  for (int j = 0; j < nb; j++) {
    wv[j] = load32(w + j * K + k, mask);
    _mm_prefetch(reinterpret_cast<const char*>(w + (j + PREFETCH_ROWS) * K + k), _MM_HINT_T0);
  }
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++) {
    __m512bh xv = load32(x + m * K + k, mask);
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
  }
}

template <int mb, int nb, typename Out>
AVX512BF16 void block_bf16(const bf16* x, const bf16* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  __m512 acc[mb][nb];
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++)
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) acc[m][j] = _mm512_setzero_ps();
  const int64_t k32 = K & ~int64_t(31);
  for (int64_t k = 0; k < k32; k += 32) step_bf16<mb, nb>(acc, x, w, K, k, ~__mmask32(0));
  if (k32 < K) step_bf16<mb, nb>(acc, x, w, K, k32, (__mmask32(1) << (K - k32)) - 1);
  float sums[mb][nb];
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++)
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) sums[m][j] = _mm512_reduce_add_ps(acc[m][j]);
  for (int m = 0; m < mb; m++)
    for (int j = 0; j < nb; j++) store(y + m * ldy + j, bias ? sums[m][j] + bias[j] : sums[m][j]);
}

// ------------------------------------------------------------------------------------ dispatch

template <typename TX, typename TW, typename Out, int mb, int nb>
void run_block(int isa, const TX* x, const TW* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  if constexpr (std::is_same_v<TX, bf16>) {
    return block_bf16<mb, nb>(x, w, bias, y, ldy, K);  // only the AVX512-BF16 path keeps bf16 inputs
  } else if constexpr (nb == 4) {  // 16 ymm registers: two 4 x 2 blocks keep the accumulators out of memory
    block_avx2<TX, TW, mb, 2>(x, w, bias, y, ldy, K);
    block_avx2<TX, TW, mb, 2>(x, w + 2 * K, bias ? bias + 2 : nullptr, y + 2, ldy, K);
  } else {
    block_avx2<TX, TW, mb, nb>(x, w, bias, y, ldy, K);
  }
}

// Rows m0.. of x (at most MB of them) times weight rows n..n+nb.
template <typename TX, typename TW, typename Out, int nb>
void rows_block(int isa, int mb, const TX* x, const TW* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  switch (mb) {
    case 1: return run_block<TX, TW, Out, 1, nb>(isa, x, w, bias, y, ldy, K);
    case 2: return run_block<TX, TW, Out, 2, nb>(isa, x, w, bias, y, ldy, K);
    case 3: return run_block<TX, TW, Out, 3, nb>(isa, x, w, bias, y, ldy, K);
    default: return run_block<TX, TW, Out, 4, nb>(isa, x, w, bias, y, ldy, K);
  }
}

// Weight blocks are handed out in small chunks from a shared counter rather than split evenly up front: when
// another process holds one of the cores, the other threads take over its share instead of waiting for it.
template <typename TX, typename TW, typename Out>
void gemm(int isa, const TX* x, const TW* w, const float* bias, Out* y, int64_t M, int64_t N, int64_t K) {
  const int64_t blocks = (N + NB - 1) / NB;
  // ~64 KB of weights per chunk: few enough grabs to cost nothing, enough chunks to balance the threads
  const int64_t chunk = std::max<int64_t>(1, 65536 / (NB * K * int64_t(sizeof(TW))));
  const int64_t tasks = (blocks + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(tasks, at::get_num_threads()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      for (int64_t first; (first = next.fetch_add(chunk)) < blocks;) {
        for (int64_t b = first; b < std::min(first + chunk, blocks); b++) {
          const int64_t n = b * NB;
          const bool full = n + NB <= N;
          for (int64_t m = 0; m < M; m += MB) {
            const int mb = int(std::min<int64_t>(MB, M - m));
            const TX* xm = x + m * K;
            if (full && M <= MB) {  // few rows: weight rows one after the other, one sequential stream
              for (int64_t j = n; j < n + NB; j++)
                rows_block<TX, TW, Out, 1>(isa, mb, xm, w + j * K, bias ? bias + j : nullptr, y + m * N + j, N, K);
            } else if (full) {
              rows_block<TX, TW, Out, NB>(isa, mb, xm, w + n * K, bias ? bias + n : nullptr, y + m * N + n, N, K);
            } else {
              for (int64_t j = n; j < N; j++)
                rows_block<TX, TW, Out, 1>(isa, mb, xm, w + j * K, bias ? bias + j : nullptr, y + m * N + j, N, K);
            }
          }
        }
      }
    }
  });
}

}  // namespace

// x [M, K] and weight [N, K] of one dtype (float32 or bfloat16, contiguous), bias [N] float32 or None.
// Returns [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                     int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear: shapes");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "linear: contiguous inputs");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "linear: x and weight dtypes differ");
  const int64_t M = x.size(0), N = weight.size(0), K = x.size(1);
  auto out = torch::empty({M, N}, x.options());
  const float* b = nullptr;
  torch::Tensor bias32;
  if (bias.has_value() && bias->defined()) {
    bias32 = bias->to(torch::kFloat32).contiguous();
    b = bias32.data_ptr<float>();
  }
  if (x.scalar_type() == torch::kFloat32) {
    gemm<float, float, float>(int(isa), x.data_ptr<float>(), weight.data_ptr<float>(), b, out.data_ptr<float>(),
                              M, N, K);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "linear: float32 or bfloat16");
    const bf16* w = reinterpret_cast<const bf16*>(weight.data_ptr());
    if (isa == ISA_AVX512BF16) {
      gemm<bf16, bf16, at::BFloat16>(int(isa), reinterpret_cast<const bf16*>(x.data_ptr()), w, b,
                                     out.data_ptr<at::BFloat16>(), M, N, K);
    } else {
      const auto x32 = x.to(torch::kFloat32);  // exact; widened once instead of once per weight block
      gemm<float, bf16, at::BFloat16>(int(isa), x32.data_ptr<float>(), w, b, out.data_ptr<at::BFloat16>(), M, N, K);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------ attention

namespace {

template <typename T>
inline float dot(const T* a, const T* b, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t d8 = D & ~int64_t(7);
  for (int64_t d = 0; d < d8; d += 8) acc = _mm256_fmadd_ps(load8<T>(a + d), load8<T>(b + d), acc);
  float s = hsum256(acc);
  for (int64_t d = d8; d < D; d++) s = std::fmaf(scalar(a[d]), scalar(b[d]), s);
  return s;
}

// Four keys' dot products with one query at once: the same per-key sequence as dot() (so the same bits),
// four independent chains instead of one latency-bound chain.
template <typename T>
inline void dot4(const T* a, const T* const b[4], int64_t D, float out[4]) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int64_t d8 = D & ~int64_t(7);
  for (int64_t d = 0; d < d8; d += 8) {
    const __m256 av = load8<T>(a + d);
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) acc[t] = _mm256_fmadd_ps(av, load8<T>(b[t] + d), acc[t]);
  }
#pragma GCC unroll 4
  for (int t = 0; t < 4; t++) {
    float s = hsum256(acc[t]);
    for (int64_t d = d8; d < D; d++) s = std::fmaf(scalar(a[d]), scalar(b[t][d]), s);
    out[t] = s;
  }
}

template <typename T, typename Out>
void attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const float* mask,
            const int64_t* mstride, float scale, float softcap, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), S = k.size(2), group = H / Hk;
  const T* qp = reinterpret_cast<const T*>(q.data_ptr());
  const T* kp = reinterpret_cast<const T*>(k.data_ptr());
  const T* vp = reinterpret_cast<const T*>(v.data_ptr());
  Out* op = reinterpret_cast<Out*>(out.data_ptr());  // [B, Q, H, D] contiguous
  // (batch, head, query) items handed out one at a time, as the GEMM's blocks are (a busy core is covered)
  const int64_t items = B * H * Q;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(items, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(S), acc(D);
    std::vector<int64_t> keys(S);
    for (int64_t item; (item = next.fetch_add(1)) < items;) {
      const int64_t b = item / (H * Q), h = (item / Q) % H, i = item % Q, hk = h / group;
      const T* qi = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const T* kb = kp + b * k.stride(0) + hk * k.stride(1);
      const T* vb = vp + b * v.stride(0) + hk * v.stride(1);
      const float* mrow = mask ? mask + b * mstride[0] + h * mstride[1] + i * mstride[2] : nullptr;
      // The keys this query sees, in cache order: the scores of exactly those, nothing else.
      int64_t n = 0;
      const int64_t causal_end = S - Q + i;  // without a mask: causal, the queries are the last Q positions
      for (int64_t j = 0; j < S; j++) {
        if (mrow ? !(mrow[j * mstride[3]] > -1e30f) : j > causal_end) continue;  // blocked (dtype-min or -inf)
        keys[n++] = j;
      }
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {
        const T* kt[4] = {kb + keys[t] * k.stride(2), kb + keys[t + 1] * k.stride(2), kb + keys[t + 2] * k.stride(2),
                          kb + keys[t + 3] * k.stride(2)};
        dot4<T>(qi, kt, D, &scores[t]);
      }
      for (; t < n; t++) scores[t] = dot<T>(qi, kb + keys[t] * k.stride(2), D);
      float best = -std::numeric_limits<float>::infinity();
      for (t = 0; t < n; t++) {
        float s = scores[t] * scale;
        if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;
        if (mrow) s += mrow[keys[t] * mstride[3]];
        scores[t] = s;
        best = std::max(best, s);
      }
      Out* o = op + ((b * Q + i) * H + h) * D;
      if (n == 0) {  // nothing visible (a padding query): zeros, like a fully masked softmax row
        for (int64_t d = 0; d < D; d++) store(o + d, 0.0f);
        continue;
      }
      float total = 0.0f;
      for (t = 0; t < n; t++) {
        scores[t] = std::exp(scores[t] - best);  // now the softmax numerators
        total += scores[t];
      }
      // acc[d] = sum over the visible keys, in order, of p * v[d]: one fused multiply-add per key and element,
      // 64 elements at a time held in registers (vector and scalar fmaf round alike, so D's tail is the same)
      const int64_t d64 = D & ~int64_t(63);
      for (int64_t d0 = 0; d0 < d64; d0 += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
        for (t = 0; t < n; t++) {
          const __m256 pv = _mm256_set1_ps(scores[t]);
          const T* vt = vb + keys[t] * v.stride(2) + d0;
#pragma GCC unroll 8
          for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(pv, load8<T>(vt + 8 * c), a[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(acc.data() + d0 + 8 * c, a[c]);
      }
      for (int64_t d = d64; d < D; d++) {
        float a = 0.0f;
        for (t = 0; t < n; t++) a = std::fmaf(scores[t], scalar(vb[keys[t] * v.stride(2) + d]), a);
        acc[d] = a;
      }
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < D; d++) store(o + d, acc[d] * inv);
    }
  });
}

}  // namespace

// q [B, H, Q, D], k / v [B, Hk, S, D] (any strides but the last dim contiguous; expanded batches allowed),
// mask None (causal, the queries being the last Q positions) or float [B|1, H|1, Q, S] added to the scores,
// a key being blocked where it is below -1e30. Returns [B, Q, H, D] in q's dtype.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const c10::optional<torch::Tensor>& mask, double scale, double softcap) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: 4D q, k, v");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "attention: last dim contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "attention: dtypes");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "attention: heads not a multiple of KV heads");
  auto out = torch::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  torch::Tensor m;
  int64_t mstride[4] = {0, 0, 0, 0};
  if (mask.has_value() && mask->defined()) {
    m = mask->to(torch::kFloat32);
    TORCH_CHECK(m.dim() == 4 && m.size(2) == q.size(2) && m.size(3) == k.size(2), "attention: mask shape");
    for (int d = 0; d < 4; d++) mstride[d] = m.size(d) == 1 ? 0 : m.stride(d);
  }
  const float* mp = m.defined() ? m.data_ptr<float>() : nullptr;
  if (q.scalar_type() == torch::kFloat32) {
    attend<float, float>(q, k, v, mp, mstride, float(scale), float(softcap), out);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "attention: float32 or bfloat16");
    attend<bf16, at::BFloat16>(q, k, v, mp, mstride, float(scale), float(softcap), out);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("linear", &linear, "few-row linear layer, rows bit-independent");
  module.def("attention", &attention, "decoding attention over the visible keys only, rows bit-independent");
}
