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

#include "quant.h"  // linear layers over GGUF blocks: quant::linear, quant::dequantize
#include "quant_int8.h"  // their int8-activation route (quant::linear with ISA_INT8)

namespace {

constexpr int ISA_AVX2 = 0;
constexpr int ISA_AVX512BF16 = 1;
constexpr int NB = 4;  // weight rows per block
// Input rows per block: 4 on the AVX512-BF16 path (4 x 4 zmm accumulators); 6 on the AVX2 path, whose 6 x 2
// blocks keep 12 ymm accumulators in flight where 4 x 2 kept 8, just enough to cover the FMA latency (Gemma's
// 262k x 640 bf16 head, AVX2 path, Zen 4: 16 rows 38 -> 32 ms, 64 rows 168 -> 136 ms, with the x row held in a
// register below; same bits).
constexpr int MB_BF16 = 4;
constexpr int MB_AVX2 = 6;
// Weight rows ahead that a block prefetches into L2 (two 4-row blocks). Into L2, not L1: a block's input rows
// all read the weight from there, and L1 keeps the inputs; a one-row, one-weight-row block (a decoding step's
// weight streamed row after row) leaves it to the hardware prefetcher. Interleaved in one process (Zen 4,
// all linears of a Gemma-3-270M token, bf16): L1 prefetch 21.2 / 27.6 / 41.2 ms at 1 / 4 / 16 rows, these
// 17.9 / 19.9 / 30.5 ms (AVX2 path 17.8 / 25.1 / 85.7 without prefetches, 17.3 / 21.3 / 62.9 with them).
constexpr int PREFETCH_ROWS = 8;

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

// Four at once, with the same bits as four calls of store: at::BFloat16 rounds to nearest even by adding
// 0x7fff plus the lowest kept bit, and turns every NaN into 0x7fc0.
inline void store4(float* y, __m128 v) { _mm_storeu_ps(y, v); }
inline void store4(at::BFloat16* y, __m128 v) {
  const __m128i u = _mm_castps_si128(v);
  const __m128i half = _mm_add_epi32(_mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1)), _mm_set1_epi32(0x7fff));
  __m128i r = _mm_srli_epi32(_mm_add_epi32(u, half), 16);
  r = _mm_blendv_epi8(r, _mm_set1_epi32(0x7fc0), _mm_castps_si128(_mm_cmpunord_ps(v, v)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(y), _mm_packus_epi32(r, r));
}

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
    if constexpr (mb > 1 || nb > 1)  // as in the bf16 path: into L2, once per 64-byte line
      if ((k * int64_t(sizeof(TW))) % 64 == 0)
        for (int j = 0; j < nb; j++)
          _mm_prefetch(reinterpret_cast<const char*>(w + (j + PREFETCH_ROWS) * K + k), _MM_HINT_T1);
#pragma GCC unroll 16
    for (int m = 0; m < mb; m++) {
      __m256 xv = load8<TX>(x + m * K + k);
      // One load feeding nb FMAs: left alone, GCC folds a load into each FMA, and the loads (not the FMAs)
      // set the pace (Zen 4: two 256-bit loads per cycle).
      if constexpr (nb > 1) __asm__("" : "+x"(xv));
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
    if constexpr (mb > 1 || nb > 1)  // into L2: every row of the block reads it from there (see PREFETCH_ROWS)
      _mm_prefetch(reinterpret_cast<const char*>(w + (j + PREFETCH_ROWS) * K + k), _MM_HINT_T1);
  }
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++) {
    __m512bh xv = load32(x + m * K + k, mask);
#pragma GCC unroll 16
    for (int j = 0; j < nb; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
  }
}

// The horizontal sums of four accumulators at once: {sum(a), sum(b), sum(c), sum(d)}, each summed by the tree
// _mm512_reduce_add_ps uses (lanes i + i+8, then i + i+4, i + i+2, i + i+1), so an element gets the same bits
// whether its block reduced it alone (few rows) or with three others; in ~11 instructions instead of ~32.
AVX512BF16 __attribute__((always_inline)) inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
  return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, s));
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
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++) {
    if constexpr (nb == 4) {  // four sums reduced, rounded and stored at once (scalar stores cost ~15% at K = 640)
      __m128 s = reduce4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
      if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias));
      store4(y + m * ldy, s);
    } else {
#pragma GCC unroll 16
      for (int j = 0; j < nb; j++) {
        const float s = _mm512_reduce_add_ps(acc[m][j]);
        store(y + m * ldy + j, bias ? s + bias[j] : s);
      }
    }
  }
}

// ------------------------------------------------------------------------------------ dispatch

template <typename TX, typename TW, typename Out, int mb, int nb>
void run_block(int isa, const TX* x, const TW* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  if constexpr (std::is_same_v<TX, bf16>) {
    return block_bf16<mb, nb>(x, w, bias, y, ldy, K);  // only the AVX512-BF16 path keeps bf16 inputs
  } else if constexpr (nb == 4 && mb <= 2) {  // 8 accumulators + 4 weights + x fit the 16 ymm registers
    block_avx2<TX, TW, mb, 4>(x, w, bias, y, ldy, K);
  } else if constexpr (nb == 4) {  // 16 ymm registers: two mb x 2 blocks keep the accumulators out of memory
    block_avx2<TX, TW, mb, 2>(x, w, bias, y, ldy, K);
    block_avx2<TX, TW, mb, 2>(x, w + 2 * K, bias ? bias + 2 : nullptr, y + 2, ldy, K);
  } else {
    block_avx2<TX, TW, mb, nb>(x, w, bias, y, ldy, K);
  }
}

// Rows m0.. of x (at most MB_BF16 or MB_AVX2 of them) times weight rows n..n+nb.
template <typename TX, typename TW, typename Out, int nb>
void rows_block(int isa, int mb, const TX* x, const TW* w, const float* bias, Out* y, int64_t ldy, int64_t K) {
  switch (mb) {
    case 1: return run_block<TX, TW, Out, 1, nb>(isa, x, w, bias, y, ldy, K);
    case 2: return run_block<TX, TW, Out, 2, nb>(isa, x, w, bias, y, ldy, K);
    case 3: return run_block<TX, TW, Out, 3, nb>(isa, x, w, bias, y, ldy, K);
    case 4: return run_block<TX, TW, Out, 4, nb>(isa, x, w, bias, y, ldy, K);
  }
  if constexpr (!std::is_same_v<TX, bf16>) {  // the AVX2 path's larger blocks
    if (mb == 5) return run_block<TX, TW, Out, 5, nb>(isa, x, w, bias, y, ldy, K);
    return run_block<TX, TW, Out, 6, nb>(isa, x, w, bias, y, ldy, K);
  }
}

// Weight blocks are handed out in chunks from a shared counter rather than split evenly up front: when another
// process holds one of the cores, the other threads take over its share instead of waiting for it. Chunks are
// long runs of weight, since each chunk starts a new stream that the hardware prefetchers must pick up again
// (64 KB chunks streamed the LM heads at ~26 GB/s where a quarter of a thread's share per chunk reaches ~40;
// interleaved measurements, Zen 4), and their number is a multiple of the threads, so that with every core
// free no thread is left with one chunk more than the others (an uneven split cost ~20% at 16 rows).
template <typename TX, typename TW, typename Out>
void gemm(int isa, const TX* x, const TW* w, const float* bias, Out* y, int64_t M, int64_t N, int64_t K,
          bool parallel = true) {
  constexpr int64_t CHUNKS_PER_THREAD = 4, MIN_CHUNK_BYTES = 128 << 10;  // below that, one thread does it
  constexpr bool avx2 = !std::is_same_v<TX, bf16>;
  constexpr int64_t MB = avx2 ? MB_AVX2 : MB_BF16;
  const int64_t blocks = (N + NB - 1) / NB;
  const int64_t threads = parallel ? at::get_num_threads() : 1;
  int64_t tasks = std::min(blocks * NB * K * int64_t(sizeof(TW)) / MIN_CHUNK_BYTES, CHUNKS_PER_THREAD * threads);
  tasks = tasks <= 1 ? 1 : std::min(blocks, (tasks + threads - 1) / threads * threads);
  const int64_t chunk = (blocks + tasks - 1) / tasks;
  tasks = (blocks + chunk - 1) / chunk;
  const int64_t workers = std::min(tasks, threads);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      for (int64_t first; (first = next.fetch_add(chunk)) < blocks;) {
        for (int64_t b = first; b < std::min(first + chunk, blocks); b++) {
          const int64_t n = b * NB;
          const bool full = n + NB <= N;
          for (int64_t m = 0; m < M; m += MB) {
            const int mb = int(std::min<int64_t>(MB, M - m));
            const TX* xm = x + m * K;
            // Few rows on the AVX512-BF16 path: weight rows one after the other, one sequential stream. The AVX2
            // path keeps 4-row blocks: one row's single FMA chain per weight row runs at its latency, not at the
            // bandwidth (Gemma's head, 1 / 4 rows: 8.4 / 12.3 ms one row at a time, 6.2 / 8.8 ms in blocks).
            if (full && M <= MB && !avx2) {
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
//
// Per (batch, KV head): the scores of every query row of the group (G heads x Q queries) against every key
// are one call of the few-row GEMM above (per-element sequence fixed, whatever the numbers of rows and
// keys); each row's softmax runs over the keys in cache order, a blocked key contributing exactly 0; and
// out[r, d] = sum over keys, in cache order, of p[r, j] * v[j, d], one fused multiply-add per key. Adding
// exact zeros changes no bits, so a query next to others and with extra masked keys gets the bits it gets
// alone with only its visible keys: what makes tree verification exact.

namespace {

constexpr int PV_ROWS = 4;    // query rows sharing each loaded value vector
constexpr int PV_CHUNK = 16;  // output elements per task (two ymm accumulators per row)
// The AVX512 form: 8 rows x 32 elements per task in zmm registers, each value vector loaded once for 8 rows.
// Gemma-3-270M, 18 layers' attention at context 256 (Zen 4): 16 queries 4.7 -> 2.8 ms, 1 query 0.59 -> 0.42.
constexpr int PV_ROWS_512 = 8, PV_CHUNK_512 = 32;
constexpr int64_t PARALLEL_WORK = int64_t(1) << 20;  // multiply-adds per KV head (R * S * D) worth a fork

template <typename T>
void pv_block(const float* p, int64_t lds, int rows, const T* v, int64_t ldv, int64_t S, int64_t d0, int64_t width,
              float* acc, int64_t lda) {
  if (width == PV_CHUNK) {
    __m256 a[PV_ROWS][2];
    for (int r = 0; r < PV_ROWS; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; j++) {
      const __m256 v0 = load8<T>(v + j * ldv + d0), v1 = load8<T>(v + j * ldv + d0 + 8);
#pragma GCC unroll 4
      for (int r = 0; r < PV_ROWS; r++) {
        if (r < rows) {
          const __m256 pr = _mm256_set1_ps(p[r * lds + j]);
          a[r][0] = _mm256_fmadd_ps(pr, v0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(pr, v1, a[r][1]);
        }
      }
    }
    for (int r = 0; r < rows; r++) {
      _mm256_storeu_ps(acc + r * lda + d0, a[r][0]);
      _mm256_storeu_ps(acc + r * lda + d0 + 8, a[r][1]);
    }
    return;
  }
  for (int r = 0; r < rows; r++)  // D's tail: scalar fmaf rounds as the vector FMA does
    for (int64_t d = d0; d < d0 + width; d++) {
      float s = 0.0f;
      for (int64_t j = 0; j < S; j++) s = std::fmaf(p[r * lds + j], scalar(v[j * ldv + d]), s);
      acc[r * lda + d] = s;
    }
}

// pv_block for bf16 values on the AVX512-BF16 path, 8 rows x 32 elements: every output element is the same
// chain of fused multiply-adds over the keys in cache order as in pv_block, so it has the same bits.
AVX512BF16 void pv_block_512(const float* p, int64_t lds, int rows, const bf16* v, int64_t ldv, int64_t S,
                             int64_t d0, float* acc, int64_t lda) {
  __m512 a[PV_ROWS_512][2];
#pragma GCC unroll 8
  for (int r = 0; r < PV_ROWS_512; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < S; j++) {
    const __m512i raw = _mm512_loadu_si512(v + j * ldv + d0);
    const __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
    const __m512 v1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
#pragma GCC unroll 8
    for (int r = 0; r < PV_ROWS_512; r++) {
      if (r < rows) {
        const __m512 pr = _mm512_set1_ps(p[r * lds + j]);
        a[r][0] = _mm512_fmadd_ps(pr, v0, a[r][0]);
        a[r][1] = _mm512_fmadd_ps(pr, v1, a[r][1]);
      }
    }
  }
  for (int r = 0; r < rows; r++) {
    _mm512_storeu_ps(acc + r * lda + d0, a[r][0]);
    _mm512_storeu_ps(acc + r * lda + d0 + 16, a[r][1]);
  }
}

// acc [R, D] = probabilities [R, S] x values [S, D] in tasks of ROWS rows x WIDTH elements: block(r0, d0).
template <int ROWS, int WIDTH, typename Block>
void pv_tasks(int64_t R, int64_t D, int64_t grain, const Block& block) {
  const int64_t blocks = (R + ROWS - 1) / ROWS, chunks = (D + WIDTH - 1) / WIDTH;
  at::parallel_for(0, blocks * chunks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) block((t / chunks) * ROWS, (t % chunks) * WIDTH);
  });
}

template <typename T, typename Out>
void attend(int isa, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const float* mask,
            const int64_t* mstride, float scale, float softcap, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), S = k.size(2), G = H / Hk, R = G * Q;
  // A decoding step's attention is a few hundred thousand multiply-adds per KV head: less than waking the
  // other threads costs (tens of microseconds per parallel region on a busy VM), so small ones run inline.
  const bool parallel = R * S * D >= PARALLEL_WORK;
  const int64_t grain = parallel ? 1 : std::numeric_limits<int64_t>::max();
  Out* op = reinterpret_cast<Out*>(out.data_ptr());  // [B, Q, H, D] contiguous
  std::vector<float> scores(R * S), acc(R * D);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t hk = 0; hk < Hk; hk++) {
      // rows r = g * Q + i: query i of head hk * G + g
      const auto rows = q[b].narrow(0, hk * G, G).reshape({R, D}).contiguous();
      auto keys = k[b][hk];
      if (keys.stride(0) != D) keys = keys.contiguous();
      if constexpr (std::is_same_v<T, float>) {
        gemm<float, float, float>(ISA_AVX2, rows.data_ptr<float>(), keys.data_ptr<float>(), nullptr, scores.data(),
                                  R, S, D, parallel);
      } else if (isa == ISA_AVX512BF16) {
        gemm<bf16, bf16, float>(isa, reinterpret_cast<const bf16*>(rows.data_ptr()),
                                reinterpret_cast<const bf16*>(keys.data_ptr()), nullptr, scores.data(), R, S, D, parallel);
      } else {
        const auto rows32 = rows.to(torch::kFloat32);
        gemm<float, bf16, float>(isa, rows32.data_ptr<float>(), reinterpret_cast<const bf16*>(keys.data_ptr()),
                                 nullptr, scores.data(), R, S, D, parallel);
      }
      std::vector<float> totals(R);
      at::parallel_for(0, R, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
          const int64_t g = r / Q, i = r % Q, h = hk * G + g;
          const float* mrow = mask ? mask + b * mstride[0] + h * mstride[1] + i * mstride[2] : nullptr;
          float* row = scores.data() + r * S;
          float best = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < S; j++) {
            const bool visible = mrow ? mrow[j * mstride[3]] > -1e30f : j <= S - Q + i;  // no mask: causal
            float s = -std::numeric_limits<float>::infinity();
            if (visible) {
              s = row[j] * scale;
              if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;
              if (mrow) s += mrow[j * mstride[3]];
            }
            row[j] = s;
            best = std::max(best, s);
          }
          float total = 0.0f;
          for (int64_t j = 0; j < S; j++) {
            row[j] = row[j] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(row[j] - best);
            total += row[j];
          }
          totals[r] = total;
        }
      });
      const T* vb = reinterpret_cast<const T*>(v.data_ptr()) + b * v.stride(0) + hk * v.stride(1);
      const int64_t ldv = v.stride(2);
      bool done = false;
      if constexpr (std::is_same_v<T, bf16>) {
        if (isa == ISA_AVX512BF16 && D % PV_CHUNK_512 == 0) {
          pv_tasks<PV_ROWS_512, PV_CHUNK_512>(R, D, grain, [&](int64_t r0, int64_t d0) {
            pv_block_512(scores.data() + r0 * S, S, int(std::min<int64_t>(PV_ROWS_512, R - r0)), vb, ldv, S, d0,
                         acc.data() + r0 * D, D);
          });
          done = true;
        }
      }
      if (!done)
        pv_tasks<PV_ROWS, PV_CHUNK>(R, D, grain, [&](int64_t r0, int64_t d0) {
          pv_block<T>(scores.data() + r0 * S, S, int(std::min<int64_t>(PV_ROWS, R - r0)), vb, ldv, S, d0,
                      std::min<int64_t>(PV_CHUNK, D - d0), acc.data() + r0 * D, D);
        });
      for (int64_t r = 0; r < R; r++) {
        const int64_t g = r / Q, i = r % Q;
        const float inv = totals[r] > 0.0f ? 1.0f / totals[r] : 0.0f;  // nothing visible (padding): zeros
        Out* o = op + ((b * Q + i) * H + hk * G + g) * D;
        for (int64_t d = 0; d < D; d++) store(o + d, acc[r * D + d] * inv);
      }
    }
  }
}

}  // namespace

// q [B, H, Q, D], k / v [B, Hk, S, D] (any strides but the last dim contiguous; expanded batches allowed),
// mask None (causal, the queries being the last Q positions) or float [B|1, H|1, Q, S] added to the scores,
// a key being blocked where it is below -1e30. Returns [B, Q, H, D] in q's dtype.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const c10::optional<torch::Tensor>& mask, double scale, double softcap, int64_t isa) {
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
    attend<float, float>(int(isa), q, k, v, mp, mstride, float(scale), float(softcap), out);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "attention: float32 or bfloat16");
    attend<bf16, at::BFloat16>(int(isa), q, k, v, mp, mstride, float(scale), float(softcap), out);
  }
  return out;
}

// ------------------------------------------------------------------------------------ norms and heads
//
// The small per-row steps of a decoder layer, each one call instead of the ~10 PyTorch ops (and their
// dispatch, ~3 us each) that Hugging Face's modules spend on them: at one token the dispatch, not the
// arithmetic, is their cost. Each row is reduced sequentially in fp32 (a fixed sequence whatever the number
// of rows, so rows stay bit-independent), and every intermediate that PyTorch's bf16 ops round is rounded at
// the same place.

namespace {

inline float round_as(float v, float) { return v; }
inline float round_as(float v, bf16) { return float(at::BFloat16(v)); }

// y = norm(x) per row of d: x * rsqrt(mean(x^2) + eps), then * scale in fp32 (Gemma: scale = 1 + w), or
// rounded to x's dtype first and then * scale (Llama, Qwen2: w * h.to(dtype)).
template <typename T>
inline void norm_row(const T* x, const float* scale, float* y, int64_t d, float eps, bool round_first) {
  float ss = 0.0f;
  for (int64_t k = 0; k < d; k++) {
    const float v = scalar(x[k]);
    ss += v * v;
  }
  const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
  for (int64_t k = 0; k < d; k++) {
    const float h = scalar(x[k]) * inv;
    y[k] = round_first ? round_as(h, T{}) * scale[k] : h * scale[k];
  }
}

template <typename T, typename Out>
void norm_rows(const T* x, int64_t ldx, const float* scale, Out* y, int64_t R, int64_t d, float eps,
               bool round_first) {
  at::parallel_for(0, R, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(d);
    for (int64_t r = r0; r < r1; r++) {
      norm_row(x + r * ldx, scale, row.data(), d, eps, round_first);
      for (int64_t k = 0; k < d; k++) store(y + r * d + k, row[k]);
    }
  });
}

// One head vector of D: optional norm, then optional rotary embedding out = x * cos + rotate_half(x) * sin,
// each product and the sum rounded to T as PyTorch's T ops round them.
template <typename T, typename Out>
void head_row(const T* x, const float* scale, float eps, bool round_first, const T* cos, const T* sin, Out* y,
              int64_t D, float* tmp) {
  if (scale) {
    norm_row(x, scale, tmp, D, eps, round_first);
    for (int64_t k = 0; k < D; k++) tmp[k] = round_as(tmp[k], T{});
  } else {
    for (int64_t k = 0; k < D; k++) tmp[k] = scalar(x[k]);
  }
  if (!cos) {
    for (int64_t k = 0; k < D; k++) store(y + k, tmp[k]);
    return;
  }
  const int64_t half = D / 2;
  for (int64_t k = 0; k < D; k++) {
    const float rotated = k < half ? -tmp[k + half] : tmp[k - half];
    const float a = round_as(tmp[k] * scalar(cos[k]), T{}), b = round_as(rotated * scalar(sin[k]), T{});
    store(y + k, a + b);
  }
}

template <typename T, typename Out>
void heads_impl(const torch::Tensor& x, int64_t H, int64_t D, const float* scale, float eps, bool round_first,
                const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t B = x.size(0), S = x.size(1);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  Out* op = reinterpret_cast<Out*>(out.data_ptr());
  const T* cp = cos.defined() ? reinterpret_cast<const T*>(cos.data_ptr()) : nullptr;
  const T* sp = sin.defined() ? reinterpret_cast<const T*>(sin.data_ptr()) : nullptr;
  const int64_t cb = cp && cos.size(0) > 1 ? cos.stride(0) : 0, cs = cp ? cos.stride(1) : 0;
  at::parallel_for(0, B * S * H, 64, [&](int64_t t0, int64_t t1) {
    std::vector<float> tmp(D);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / (S * H), s = (t / H) % S, h = t % H;
      head_row<T, Out>(xp + b * x.stride(0) + s * x.stride(1) + h * D, scale, eps, round_first,
                       cp ? cp + b * cb + s * cs : nullptr, sp ? sp + b * cb + s * cs : nullptr,
                       op + ((b * H + h) * S + s) * D, D, tmp.data());
    }
  });
}

}  // namespace

// x [R, d] (rows may be strided, last dim contiguous), scale [d] float32 -> [R, d] in x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, double eps, bool round_first) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && scale.scalar_type() == torch::kFloat32 &&
              scale.is_contiguous() && scale.numel() == x.size(1), "rms_norm: x [R, d], float32 scale [d]");
  auto out = torch::empty(x.sizes(), x.options());
  if (x.scalar_type() == torch::kFloat32) {
    norm_rows<float, float>(x.data_ptr<float>(), x.stride(0), scale.data_ptr<float>(), out.data_ptr<float>(),
                            x.size(0), x.size(1), float(eps), round_first);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "rms_norm: float32 or bfloat16");
    norm_rows<bf16, at::BFloat16>(reinterpret_cast<const bf16*>(x.data_ptr()), x.stride(0), scale.data_ptr<float>(),
                                  out.data_ptr<at::BFloat16>(), x.size(0), x.size(1), float(eps), round_first);
  }
  return out;
}

// x [B, S, H * D] (last dim contiguous) -> [B, H, S, D] contiguous in x's dtype: each head vector normed
// (scale [D] float32, or None) and rotated (cos / sin [B|1, S, D] in x's dtype, last dim contiguous, or None).
torch::Tensor heads(const torch::Tensor& x, int64_t H, const c10::optional<torch::Tensor>& scale, double eps,
                    bool round_first, const c10::optional<torch::Tensor>& cos, const c10::optional<torch::Tensor>& sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) % H == 0, "heads: x [B, S, H * D]");
  const int64_t D = x.size(2) / H;
  const bool normed = scale.has_value() && scale->defined(), rotated = cos.has_value() && cos->defined();
  TORCH_CHECK(!normed || (scale->scalar_type() == torch::kFloat32 && scale->is_contiguous() && scale->numel() == D),
              "heads: float32 scale [D]");
  torch::Tensor c, s;
  if (rotated) {
    c = *cos;
    s = *sin;
    TORCH_CHECK(c.dim() == 3 && c.sizes() == s.sizes() && c.strides() == s.strides() && c.size(1) == x.size(1) &&
                c.size(2) == D && c.stride(2) == 1 && c.scalar_type() == x.scalar_type() && D % 2 == 0,
                "heads: cos / sin [B|1, S, D] in x's dtype");
  }
  auto out = torch::empty({x.size(0), H, x.size(1), D}, x.options());
  const float* sc = normed ? scale->data_ptr<float>() : nullptr;
  if (x.scalar_type() == torch::kFloat32) {
    heads_impl<float, float>(x, H, D, sc, float(eps), round_first, c, s, out);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "heads: float32 or bfloat16");
    heads_impl<bf16, at::BFloat16>(x, H, D, sc, float(eps), round_first, c, s, out);
  }
  return out;
}

// ------------------------------------------------------------------------------------ top k of each row
//
// The k largest logits of each row: k = 1 is greedy acceptance's argmax, k = 8 Token Recycling's table rows.
// PyTorch's CPU max / topk over a 262k-entry bf16 row take 0.2 / 0.5 ms, a few percent of a decoding step.
// One pass here compares 8 entries at a time with the current k-th largest and touches scalars only when one
// beats it (rare after the first few thousand), so a row costs about what reading it costs. Ties keep the
// lower index first (argmax's first maximum). A NaN is never picked; rows that hold one are flagged, and the
// caller asks PyTorch for them (PyTorch ranks NaN above everything).

namespace {

// The best k (value, index) pairs seen so far, largest first; equal values in the order they were offered.
struct Best {
  int k, n = 0;
  float* value;
  int64_t* index;

  float threshold() const { return n < k ? -std::numeric_limits<float>::infinity() : value[k - 1]; }
  void offer(float v, int64_t i) {  // the caller checked v > threshold() (or n < k)
    int pos = n < k ? n++ : k - 1;
    for (; pos > 0 && value[pos - 1] < v; pos--) {
      value[pos] = value[pos - 1];
      index[pos] = index[pos - 1];
    }
    value[pos] = v;
    index[pos] = i;
  }
};

template <typename T>
bool top_k_row(const T* x, int64_t V, int k, int64_t* out) {
  std::vector<float> value(k);
  Best best{k, 0, value.data(), out};
  int64_t i = 0;
  bool nan = false;
  for (; i < V && best.n < k; i++) {  // the first k entries fill the list (-inf included)
    const float v = scalar(x[i]);
    nan |= std::isnan(v);
    if (!std::isnan(v)) best.offer(v, i);
  }
  __m256 threshold = _mm256_set1_ps(best.threshold());
  __m256 unordered = _mm256_setzero_ps();
  for (; i + 8 <= V; i += 8) {
    const __m256 v = load8(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    int above = _mm256_movemask_ps(_mm256_cmp_ps(v, threshold, _CMP_GT_OQ));
    if (!above) continue;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (; above; above &= above - 1) {
      const int lane = __builtin_ctz(above);
      if (lanes[lane] > best.threshold()) best.offer(lanes[lane], i + lane);
    }
    threshold = _mm256_set1_ps(best.threshold());
  }
  for (; i < V; i++) {
    const float v = scalar(x[i]);
    nan |= std::isnan(v);
    if (v > best.threshold()) best.offer(v, i);
  }
  return nan || _mm256_movemask_ps(unordered) != 0;
}

template <typename T>
void top_k_rows(const T* x, int64_t R, int64_t V, int k, int64_t* out, bool* nan) {
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) nan[r] = top_k_row(x + r * V, V, k, out + r * k);
  });
}

}  // namespace

// x [R, V] float32 or bfloat16, contiguous -> (indices int64 [R, k], largest first, ties to the lower index;
// nan bool [R]: the row holds a NaN and its indices are not PyTorch's).
std::tuple<torch::Tensor, torch::Tensor> top_k(const torch::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && k >= 1 && k <= x.size(1), "top_k: contiguous x [R, V], 1 <= k <= V");
  const int64_t R = x.size(0), V = x.size(1);
  auto indices = torch::empty({R, k}, x.options().dtype(torch::kInt64));
  auto nan = torch::empty({R}, x.options().dtype(torch::kBool));
  if (x.scalar_type() == torch::kFloat32) {
    top_k_rows(x.data_ptr<float>(), R, V, int(k), indices.data_ptr<int64_t>(), nan.data_ptr<bool>());
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "top_k: float32 or bfloat16");
    top_k_rows(reinterpret_cast<const bf16*>(x.data_ptr()), R, V, int(k), indices.data_ptr<int64_t>(),
               nan.data_ptr<bool>());
  }
  return {indices, nan};
}

// ------------------------------------------------------------------------------------ decoder layers
//
// A whole stack of decoder layers in one call (specnb/decoder.py's Layer, step for step): at one token a
// Gemma-3-270M layer is ~12 kernel calls and ~25 small tensor ops, and the Python around them (argument
// checks, views, the cache's bookkeeping) cost ~2 ms of a ~22 ms call. Here the same kernels and the same
// ATen ops run in the same order on the same dtypes, so the result has the bits of the Python layer.

struct Norm {
  torch::Tensor scale;  // float32 [d]
  double eps = 0.0;
  bool round_first = false;
};

// One projection's weight as GGUF blocks (quant::linear): uint8 [N, row bytes] of ggml type `type`; int8: with
// int8 activations (quant_int8.h) whatever the call's path.
struct Blocks {
  torch::Tensor blocks;
  int64_t type = 0;
  c10::optional<torch::Tensor> bias;
  bool int8 = false;
};

struct LayerSpec {
  torch::Tensor qkv, o, gate_up, down;  // dense weights [N, K], q/k/v and gate/up stacked
  c10::optional<torch::Tensor> qkv_bias, o_bias, gate_up_bias, down_bias;
  // or GGUF blocks, one per projection (q, k, v / o / gate, up / down: their formats differ); empty: dense
  std::vector<Blocks> qkv_blocks, o_blocks, gate_up_blocks, down_blocks;
  int64_t q_size = 0, k_size = 0, gate_size = 0, heads = 0, kv_heads = 0;
  double scaling = 1.0, softcap = 0.0;
  c10::optional<Norm> q_norm, k_norm, pre_mlp_norm, post_mlp_norm;  // pre/post mlp: Gemma's sandwich norms
  Norm input_norm, post_attention_norm;
  int64_t act = 0;  // ACT_SILU or ACT_GELU_TANH
};

constexpr int64_t ACT_SILU = 0;
constexpr int64_t ACT_GELU_TANH = 1;

namespace {

torch::Tensor normed(const torch::Tensor& x, const Norm& n) {  // x [R, d]
  return rms_norm(x, n.scale, n.eps, n.round_first);
}

// x [R, K] times a projection: the dense weight, or each of its GGUF blocks' outputs side by side.
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& dense, const c10::optional<torch::Tensor>& bias,
                      const std::vector<Blocks>& blocks, int64_t isa) {
  if (blocks.empty()) return linear(x, dense, bias, isa);
  std::vector<torch::Tensor> outs;
  for (const Blocks& b : blocks) outs.push_back(quant::linear(x, b.blocks, b.type, b.bias, b.int8 ? quant::ISA_INT8 : isa));
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 1);
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t H, const c10::optional<Norm>& n, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  if (!n.has_value()) return heads(x, H, c10::nullopt, 0.0, false, cos, sin);
  return heads(x, H, n->scale, n->eps, n->round_first, cos, sin);
}

}  // namespace

// x [1, S, d] after the embedding; per layer i: cos[i] / sin[i] [1, S, D], masks[i] None (causal) or float
// [1, 1, S, start + S], key / value buffers [1, Hk, capacity >= start + S, D] holding the cache's first
// ``start`` positions. Writes the call's keys and values at start..start+S-1 of each buffer and returns the
// last layer's output [1, S, d] (before the final norm).
torch::Tensor decoder_layers(torch::Tensor x, const std::vector<LayerSpec>& layers, const std::vector<torch::Tensor>& cos,
                             const std::vector<torch::Tensor>& sin,
                             const std::vector<c10::optional<torch::Tensor>>& masks,
                             const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                             int64_t start, int64_t isa) {
  const int64_t n = int64_t(layers.size());
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1, "decoder_layers: x [1, S, d]");
  TORCH_CHECK(int64_t(cos.size()) == n && int64_t(sin.size()) == n && int64_t(masks.size()) == n &&
              int64_t(keys.size()) == n && int64_t(values.size()) == n, "decoder_layers: one entry per layer");
  const int64_t S = x.size(1), d = x.size(2), end = start + S;
  for (int64_t i = 0; i < n; i++) {
    const LayerSpec& L = layers[i];
    TORCH_CHECK(keys[i].size(2) >= end && values[i].size(2) >= end, "decoder_layers: cache buffer too short");
    const auto h = normed(x.view({S, d}), L.input_norm);
    const auto qkv = project(h, L.qkv, L.qkv_bias, L.qkv_blocks, isa).view({1, S, -1});
    const int64_t kv_end = L.q_size + L.k_size;
    const auto q = split_heads(qkv.narrow(2, 0, L.q_size), L.heads, L.q_norm, cos[i], sin[i]);  // [1, H, S, D]
    const auto k = split_heads(qkv.narrow(2, L.q_size, L.k_size), L.kv_heads, L.k_norm, cos[i], sin[i]);
    const auto v = qkv.narrow(2, kv_end, qkv.size(2) - kv_end).view({1, S, L.kv_heads, -1}).transpose(1, 2);
    keys[i].narrow(2, start, S).copy_(k);
    values[i].narrow(2, start, S).copy_(v);
    const auto out = attention(q, keys[i].narrow(2, 0, end), values[i].narrow(2, 0, end), masks[i], L.scaling,
                               L.softcap, isa);  // [1, S, H, D]
    auto o = project(out.view({S, -1}), L.o, L.o_bias, L.o_blocks, isa);  // [S, d]
    torch::Tensor x2;
    if (!L.pre_mlp_norm.has_value()) {  // Llama, Qwen2
      x = x.view({S, d}) + o;
      x2 = normed(x, L.post_attention_norm);
    } else {  // Gemma
      x = x.view({S, d}) + normed(o, L.post_attention_norm);
      x2 = normed(x, *L.pre_mlp_norm);
    }
    const auto gu = project(x2, L.gate_up, L.gate_up_bias, L.gate_up_blocks, isa);
    const auto gate = gu.narrow(1, 0, L.gate_size), up = gu.narrow(1, L.gate_size, gu.size(1) - L.gate_size);
    const auto a = (L.act == ACT_GELU_TANH ? at::gelu(gate, "tanh") : at::silu(gate)) * up;
    auto down = project(a.contiguous(), L.down, L.down_bias, L.down_blocks, isa);
    x = (x + (L.post_mlp_norm.has_value() ? normed(down, *L.post_mlp_norm) : down)).view({1, S, d});
  }
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("linear", &linear, "few-row linear layer, rows bit-independent");
  module.def("attention", &attention, "decoding attention over the visible keys only, rows bit-independent");
  module.def("rms_norm", &rms_norm, "RMS norm per row, fp32 reduction in order");
  module.def("top_k", &top_k, "indices of the k largest entries of each row, ties to the lower index");
  module.def("heads", &heads, "split into heads [B, H, S, D], with optional per-head norm and rotary embedding");
  pybind11::class_<Norm>(module, "Norm", pybind11::module_local())
      .def(pybind11::init<>())
      .def_readwrite("scale", &Norm::scale)
      .def_readwrite("eps", &Norm::eps)
      .def_readwrite("round_first", &Norm::round_first);
  module.def("block_linear", &quant::linear, "few-row linear layer over GGUF blocks, rows bit-independent");
  module.def("block_dequantize", &quant::dequantize, "GGUF blocks to float32 rows, as block_linear decodes them");
  pybind11::class_<Blocks>(module, "Blocks", pybind11::module_local())
      .def(pybind11::init<>())
      .def_readwrite("blocks", &Blocks::blocks)
      .def_readwrite("type", &Blocks::type)
      .def_readwrite("bias", &Blocks::bias)
      .def_readwrite("int8", &Blocks::int8);
  pybind11::class_<LayerSpec>(module, "LayerSpec", pybind11::module_local())
      .def(pybind11::init<>())
#define FIELD(name) .def_readwrite(#name, &LayerSpec::name)
      FIELD(qkv) FIELD(o) FIELD(gate_up) FIELD(down) FIELD(qkv_bias) FIELD(o_bias) FIELD(gate_up_bias) FIELD(down_bias)
      FIELD(q_size) FIELD(k_size) FIELD(gate_size) FIELD(heads) FIELD(kv_heads) FIELD(scaling) FIELD(softcap)
      FIELD(q_norm) FIELD(k_norm) FIELD(pre_mlp_norm) FIELD(post_mlp_norm) FIELD(input_norm)
      FIELD(post_attention_norm) FIELD(act) FIELD(qkv_blocks) FIELD(o_blocks) FIELD(gate_up_blocks) FIELD(down_blocks);
#undef FIELD
  module.attr("ACT_SILU") = ACT_SILU;
  module.attr("ACT_GELU_TANH") = ACT_GELU_TANH;
  module.def("decoder_layers", &decoder_layers, "a stack of decoder layers in one call (specnb/decoder.py's Layer)");
}
