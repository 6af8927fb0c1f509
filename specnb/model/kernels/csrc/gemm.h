// The dense few-row GEMM (fp32 or bf16 weights) behind linear() and attention's scores.
//
// Each thread takes chunks of weight rows and multiplies every input row with four weight rows while they sit
// in L1, so each weight is read from memory once per call. Rows are bit-independent: every output element is
// computed by the same instruction sequence whatever the number of rows M and wherever its row sits in a block
// (lane-wise accumulation over K in order, one fixed horizontal sum, bias added in fp32, one rounding to the
// output dtype). Why each block size and prefetch distance: docs/kernels.md.

#pragma once

#include "common.h"

namespace {

constexpr int NB = 4;  // weight rows per block
constexpr int MB_BF16 = 4;  // input rows per block, AVX512-BF16 path: 4 x 4 zmm accumulators
constexpr int MB_AVX2 = 6;  // input rows per block, AVX2 path: 6 x 2 ymm accumulators cover the FMA latency
constexpr int PREFETCH_ROWS = 8;  // weight rows ahead prefetched into L2 (two 4-row blocks)

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
      // set the pace (two 256-bit loads per cycle).
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
    if constexpr (mb > 1 || nb > 1)  // into L2: every row of the block reads it from there
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
    if constexpr (nb == 4) {  // four sums reduced, rounded and stored at once
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
// long runs of weight (each starts a new stream the hardware prefetchers must pick up), and their number is a
// multiple of the threads, so that with every core free no thread gets one chunk more than the others.
template <typename TX, typename TW, typename Out>
void gemm(int isa, const TX* x, const TW* w, const float* bias, Out* y, int64_t M, int64_t N, int64_t K,
          bool parallel = true) {
  constexpr int64_t CHUNKS_PER_THREAD = 4, MIN_CHUNK_BYTES = 128 << 10;  // below that, one thread does it
  constexpr bool avx2 = !std::is_same_v<TX, bf16>;
  constexpr int64_t MB = avx2 ? MB_AVX2 : MB_BF16;
  const int64_t blocks = (N + NB - 1) / NB;
  const int64_t threads = parallel ? at::get_num_threads() : 1;
  // a chunk's weight bytes times its passes over them (one per block of MB rows): attention's scores read a
  // small weight (the keys) with many rows (heads x queries)
  const int64_t passes = (M + MB - 1) / MB;
  int64_t tasks = std::min(blocks * NB * K * int64_t(sizeof(TW)) * passes / MIN_CHUNK_BYTES, CHUNKS_PER_THREAD * threads);
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
            // bandwidth.
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
