// Few-row linear layers over GGUF's quantized weight blocks (Q8_0, Q5_0, Q4_K, Q6_K), entered through
// quant.cpp (the extension's block_linear / block_dequantize; the layer stack runs them too).
//
// A decoding call is bound by reading the weights, and a GGUF file holds them in 4.5-8.5 bits each: streaming
// the blocks as stored reads 2-3.5x fewer bytes than their bf16 dequantization. Each thread takes a run of
// weight rows and prefetches into L2 ahead of where it reads. Each group of 32 weights is decoded in registers
// and multiplied with a few input rows at once (the AVX2 path, past MB rows, decodes a weight row once into a
// buffer and multiplies every input row with it). Both decode to the gguf package's fp32
// values (scale * q - offset, the same operations) and run the same operations per output element.
//
// Rows are bit-independent: each output element is the same instruction sequence whatever the number of rows
// and wherever its row sits (a fixed accumulation over K in order, one fixed reduction, bias added in fp32, one
// rounding to the output dtype), so a verified draft gets the bits of decoding its tokens alone. Activations
// are never quantized: bf16 ones are widened to fp32 (exact) and every product is fp32.
//
// Paths (common.h; the caller picks one from the CPU flags):
//   ISA_AVX2        every x86 class: fp32 FMAs over ymm, four 8-lane accumulators per row; up to MB rows fused.
//   ISA_AVX512BF16  AVX512 classes: the same in zmm, two FMAs per group into one 16-lane accumulator per row;
//                   input rows 8-16 at a time, each group decoded in registers (never buffered). fp32 rather
//                   than bf16 dot products: the codes reach fp32 in fewer instructions (docs/forward_pass.md).
// Threads: ATen's intra-op pool (at::parallel_for), the one torch.set_num_threads controls.

#pragma once

#include "common.h"

namespace quant {

// ggml's type ids (gguf.GGMLQuantizationType)
constexpr int Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14;
constexpr int MB = 3;  // input rows per pass over a decoded weight row: 3 x 4 ymm accumulators (AVX2 path)

struct Format {
  int64_t weights;  // per block
  int64_t bytes;    // per block
};

constexpr Format format(int type) {
  switch (type) {
    case Q8_0: return {32, 34};   // fp16 d, int8 q[32]: w = d * q
    case Q5_0: return {32, 22};   // fp16 d, uint32 high bits, 16 bytes of low nibbles: w = d * (q - 16)
    case Q4_K: return {256, 144}; // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    case Q6_K: return {256, 210}; // 128 bytes low nibbles, 64 bytes high 2-bit pairs, int8 scales[16], fp16 d
    default: return {0, 0};
  }
}

Format checked_format(int type) {
  const Format f = format(type);
  TORCH_CHECK(f.weights > 0, "quant: unsupported ggml type ", type);
  return f;
}

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Weight bytes ahead that each group prefetches into L2. Decoding takes long enough per byte that the hardware
// prefetchers alone leave the loop waiting on memory; into L2, not L1, as gemm.h does.
constexpr int64_t PREFETCH_BYTES = 4096;

inline void prefetch(const uint8_t* group) {
  _mm_prefetch(reinterpret_cast<const char*>(group + PREFETCH_BYTES), _MM_HINT_T1);
}

// bit j of x -> byte j of the result: 0xff where set, 0 where not
inline __m256i bits_to_bytes(uint32_t x) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(x)), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // byte i: every bit but bit i
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

// A block's scales, each the gguf package's fp32 product: group i's weights 0-15 scale by lo[i], 16-31 by hi[i],
// and Q4_K's then subtract off[i]. Decoded once per block with vector instructions, not once per group.
struct Scales {
  float lo[8], hi[8], off[8];
};

template <int type>
inline __attribute__((always_inline)) void block_scales(const uint8_t* p, Scales& s) {
  if constexpr (type == Q8_0 || type == Q5_0) {
    s.lo[0] = s.hi[0] = half(p);
  } else if constexpr (type == Q4_K) {  // 6-bit scales and mins packed in 12 bytes at p + 4
    uint32_t u[3];
    std::memcpy(u, p + 4, 12);
    constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t sc[2] = {u[0] & low6, (u[2] & low4) | (((u[0] >> 6) & low2) << 4)};
    const uint32_t mn[2] = {u[1] & low6, ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4)};
    const auto floats = [](const uint32_t* bytes) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes))));
    };
    const __m256 lo = _mm256_mul_ps(_mm256_set1_ps(half(p)), floats(sc));
    _mm256_storeu_ps(s.lo, lo);
    _mm256_storeu_ps(s.hi, lo);
    _mm256_storeu_ps(s.off, _mm256_mul_ps(_mm256_set1_ps(half(p + 2)), floats(mn)));
  } else {  // Q6_K: int8 scales[16] at p + 192, one per 16 weights, fp16 d at p + 208
    const __m128i even_odd = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)),
                                              _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m256 d = _mm256_set1_ps(half(p + 208));
    _mm256_storeu_ps(s.lo, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(even_odd))));
    _mm256_storeu_ps(s.hi, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(even_odd, 8)))));
  }
}

// Group i (of 32 weights) of the block at p: its 32 small integers q (int8 lanes, in order).
template <int type>
inline __attribute__((always_inline)) __m256i decode_group(const uint8_t* p, int i) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  if constexpr (type == Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  } else if constexpr (type == Q5_0) {
    uint32_t high;
    std::memcpy(&high, p + 2, 4);
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), nibble);
    q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(high), _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
  } else if constexpr (type == Q4_K) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (i / 2)));
    return _mm256_and_si256(i % 2 ? _mm256_srli_epi16(raw, 4) : raw, nibble);
  } else {  // Q6_K: 128 bytes of low nibbles, 64 of high bit pairs
    const int h = i / 4, j = i % 4;
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (j % 2)));
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    const __m256i low4 = _mm256_and_si256(j < 2 ? bytes : _mm256_srli_epi16(bytes, 4), nibble);
    const __m256i high2 = j == 0 ? _mm256_slli_epi16(high, 4) : j == 1 ? _mm256_slli_epi16(high, 2)
                          : j == 2 ? high : _mm256_srli_epi16(high, 2);
    return _mm256_sub_epi8(_mm256_or_si256(low4, _mm256_and_si256(high2, _mm256_set1_epi8(0x30))),
                           _mm256_set1_epi8(32));
  }
}

// Group i of the block, decoded to fp32 for the AVX2 path: w[c] = weights 8c..8c+7 = scale * q - offset (the
// gguf package's operations).
template <int type>
inline __attribute__((always_inline)) void group_weights(const uint8_t* block, int i, const Scales& s, __m256 w[4]) {
  const __m256i q = decode_group<type>(block, i);
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int c = 0; c < 4; c++) {
    const __m128i bytes = c % 2 ? _mm_srli_si128(halves[c / 2], 8) : halves[c / 2];
    w[c] = _mm256_mul_ps(_mm256_set1_ps(c < 2 ? s.lo[i] : s.hi[i]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
    if constexpr (type == Q4_K) w[c] = _mm256_sub_ps(w[c], _mm256_set1_ps(s.off[i]));
  }
}

// One weight row as fp32 weights (the AVX2 path's buffer, and dequantize()).
template <int type>
void decode_row(const uint8_t* row, int64_t K, float* out) {
  constexpr Format f = format(type);
  for (int64_t b = 0; b < K / f.weights; b++) {
    Scales s;
    block_scales<type>(row + b * f.bytes, s);
#pragma GCC unroll 8
    for (int i = 0; i < f.weights / 32; i++) {
      __m256 w[4];
      prefetch(row + b * f.bytes + 32 * i);
      group_weights<type>(row + b * f.bytes, i, s, w);
      for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + b * f.weights + 32 * i + 8 * c, w[c]);
    }
  }
}

// The AVX2 path's accumulation, shared by its two loops: acc[c] += x[k + 8c ..] * w[c] for one group of 32.
// Per element: four 8-lane accumulators over K in steps of 32, reduced as (a0 + a1) + (a2 + a3), then hsum256.
inline __attribute__((always_inline)) void accumulate(const float* x, const __m256 w[4], __m256 acc[4]) {
  for (int c = 0; c < 4; c++) acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * c), w[c], acc[c]);
}

inline float reduce(const __m256 acc[4]) {
  return hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// y[m, 0] for m < mb: x rows [mb, K] (stride K) times the weight row w [K] decoded into a buffer.
template <int mb, typename Out>
void dot_rows(const float* x, const float* w, float bias, Out* y, int64_t ldy, int64_t K) {
  __m256 acc[mb][4];
  for (int m = 0; m < mb; m++)
    for (int a = 0; a < 4; a++) acc[m][a] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __m256 w4[4] = {_mm256_loadu_ps(w + k), _mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(w + k + 16),
                          _mm256_loadu_ps(w + k + 24)};
    for (int m = 0; m < mb; m++) accumulate(x + m * K + k, w4, acc[m]);
  }
  for (int m = 0; m < mb; m++) store(y + m * ldy, reduce(acc[m]) + bias);
}

// The same for a weight row decoded group by group in registers (no buffer): a few input rows.
template <int type, int mb, typename Out>
void dot_rows_fused(const float* x, const uint8_t* row, float bias, Out* y, int64_t ldy, int64_t K) {
  constexpr Format f = format(type);
  __m256 acc[mb][4];
  for (int m = 0; m < mb; m++)
    for (int a = 0; a < 4; a++) acc[m][a] = _mm256_setzero_ps();
  for (int64_t b = 0; b < K / f.weights; b++) {
    Scales s;
    block_scales<type>(row + b * f.bytes, s);
#pragma GCC unroll 8
    for (int i = 0; i < f.weights / 32; i++) {
      __m256 w[4];
      prefetch(row + b * f.bytes + 32 * i);
      group_weights<type>(row + b * f.bytes, i, s, w);
      for (int m = 0; m < mb; m++) accumulate(x + m * K + b * f.weights + 32 * i, w, acc[m]);
    }
  }
  for (int m = 0; m < mb; m++) store(y + m * ldy, reduce(acc[m]) + bias);
}

// Weight rows are handed out in runs from a shared counter (a busy core's share goes to the others), each run
// long enough to be one sequential stream for the prefetchers (16 KB at least, so that a small projection such as
// a 112 KB k still splits across threads), at most runs_per_thread a thread; body(first, last) does rows
// [first, last).
constexpr int64_t RUNS_PER_THREAD = 4;
template <typename Body>
void for_each_row_run(int64_t N, int64_t row_bytes, const Body& body, int64_t runs_per_thread = RUNS_PER_THREAD) {
  constexpr int64_t MIN_RUN_BYTES = 16 << 10;
  const int64_t threads = at::get_num_threads();
  int64_t runs = std::min(N * row_bytes / MIN_RUN_BYTES, runs_per_thread * threads);
  runs = std::max<int64_t>(1, std::min(runs, N));
  const int64_t run = (N + runs - 1) / runs;
  runs = (N + run - 1) / run;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(runs, threads), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++)
      for (int64_t first; (first = next.fetch_add(run)) < N;) body(first, std::min(first + run, N));
  });
}

// AVX2 path: up to MB input rows decode each weight row in registers; more decode it once into a buffer and
// multiply every MB rows with it. Both run the same operations per output element.
template <int type, typename Out>
void qgemm(const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M, int64_t N,
           int64_t K) {
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    std::vector<float> decoded(M > MB ? K : 0);
    for (int64_t n = first; n < last; n++) {
      const uint8_t* row = w + n * row_bytes;
      const float b = bias ? bias[n] : 0.0f;
      if (M <= MB) {
        if (M == 3) dot_rows_fused<type, 3>(x, row, b, y + n, N, K);
        if (M == 2) dot_rows_fused<type, 2>(x, row, b, y + n, N, K);
        if (M == 1) dot_rows_fused<type, 1>(x, row, b, y + n, N, K);
        continue;
      }
      decode_row<type>(row, K, decoded.data());
      int64_t m = 0;
      for (; m + MB <= M; m += MB) dot_rows<MB>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
      if (M - m == 2) dot_rows<2>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
      if (M - m == 1) dot_rows<1>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
    }
  });
}

template <typename Out>
void qgemm_any(int type, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
               int64_t N, int64_t K) {
  switch (type) {
    case Q8_0: qgemm<Q8_0>(x, w, row_bytes, bias, y, M, N, K); break;
    case Q5_0: qgemm<Q5_0>(x, w, row_bytes, bias, y, M, N, K); break;
    case Q4_K: qgemm<Q4_K>(x, w, row_bytes, bias, y, M, N, K); break;
    default: qgemm<Q6_K>(x, w, row_bytes, bias, y, M, N, K); break;
  }
}

// ------------------------------------------------------------------------------------ AVX512

#define QUANT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))

constexpr int MAX_FUSED_512 = 16;  // input rows multiplied with each group decoded in registers
constexpr int64_t L1_ROWS_BYTES = 48 << 10;  // a chunk's fp32 input rows beyond this get 8 rows (read from L2)

// Group i of the block as 32 fp32 weights in two zmm, the gguf package's values scale * q - offset (as group_weights).
template <int type>
QUANT_AVX512 inline __attribute__((always_inline)) void group_weights_512(const uint8_t* block, int i, const Scales& s,
                                                                        __m512& w0, __m512& w1) {
  const __m256i q = decode_group<type>(block, i);
  if constexpr (type == Q4_K) {  // 16 codes: each weight looked up in the group's table of scale * c - offset
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(s.lo[i]), codes), _mm512_set1_ps(s.off[i]));
    w0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)), table);
    w1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)), table);
  } else {
    w0 = _mm512_mul_ps(_mm512_set1_ps(s.lo[i]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
    w1 = _mm512_mul_ps(_mm512_set1_ps(s.hi[i]),
                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
  }
}

// The AVX512 path's accumulation: per output element and group of 32, in order,
// acc = fma(x[k..k+15], w[k..k+15], acc), then acc = fma(x[k+16..k+31], w[k+16..k+31], acc).
QUANT_AVX512 inline __attribute__((always_inline)) __m512 step_512(__m512 acc, const float* x, __m512 w0, __m512 w1) {
  return _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), w1, _mm512_fmadd_ps(_mm512_loadu_ps(x), w0, acc));
}

// y[m, r * apart] for m < mb, r < nr: nr weight rows `apart` rows from each other (rows of row_bytes), decoded group
// by group in registers, times x [mb, K]; nr rows at once give the core independent accumulations to overlap, and
// rows far apart give the memory system nr streams to fetch side by side.
template <int type, int mb, int nr, typename Out>
QUANT_AVX512 void dot_rows_fused_512(const float* x, const uint8_t* rows, int64_t row_bytes, const float* bias, Out* y,
                                     int64_t ldy, int64_t K, int64_t apart = 1) {
  constexpr Format f = format(type);
  __m512 acc[nr][mb];
  for (int r = 0; r < nr; r++)
    for (int m = 0; m < mb; m++) acc[r][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / f.weights; b++) {
    Scales s[nr];
    for (int r = 0; r < nr; r++) block_scales<type>(rows + r * apart * row_bytes + b * f.bytes, s[r]);
#pragma GCC unroll 8
    for (int i = 0; i < f.weights / 32; i++) {
      const int64_t k = b * f.weights + 32 * i;
      for (int r = 0; r < nr; r++) {
        __m512 w0, w1;
        prefetch(rows + r * apart * row_bytes + b * f.bytes + 32 * i);
        group_weights_512<type>(rows + r * apart * row_bytes + b * f.bytes, i, s[r], w0, w1);
        for (int m = 0; m < mb; m++) acc[r][m] = step_512(acc[r][m], x + m * K + k, w0, w1);
      }
    }
  }
  for (int r = 0; r < nr; r++)
    for (int m = 0; m < mb; m++)
      store(y + m * ldy + r * apart, _mm512_reduce_add_ps(acc[r][m]) + (bias ? bias[r * apart] : 0.0f));
}

template <int type, typename Out, int mb = 1>
QUANT_AVX512 void fused_rows_512(int64_t M, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias,
                                 Out* y, int64_t N, int64_t K, int64_t first, int64_t last) {
  if constexpr (mb <= MAX_FUSED_512) {
    if (M != mb) return fused_rows_512<type, Out, mb + 1>(M, x, w, row_bytes, bias, y, N, K, first, last);
    constexpr int nr = mb <= 2 ? 4 : mb <= 8 ? 2 : 1;  // weight rows a pass, within 32 zmm registers
    // the run split into nr parts read side by side: nr streams far apart
    const int64_t part = (last - first) / nr;
    for (int64_t i = 0; i < part; i++) {
      const int64_t n = first + i;
      dot_rows_fused_512<type, mb, nr>(x, w + n * row_bytes, row_bytes, bias ? bias + n : nullptr, y + n, N, K, part);
    }
    for (int64_t n = first + nr * part; n < last; n++)
      dot_rows_fused_512<type, mb, 1>(x, w + n * row_bytes, row_bytes, bias ? bias + n : nullptr, y + n, N, K);
  }
}

// Many input rows (prefills, long verification calls): each weight row is decoded once per block of input rows
// into a buffer (decode_row: the gguf package's values, which group_weights_512 gives in registers too), then
// multiplied with TILE_M input rows and TILE_N weight rows at a time from registers. Every output element takes the
// same operations as in dot_rows_fused_512 (one accumulator, fma over k in steps of 16, then reduce_add), so the
// bits do not depend on the path or the row count.
constexpr int TILE_N = 4, TILE_M = 6;  // 24 accumulators, 4 weight vectors, 1 input vector: within 32 zmm
constexpr int64_t TILED_MIN_ROWS = 24;  // from here the decoded-buffer path beats decoding in registers
constexpr int64_t TILED_X_BYTES = 1 << 20;  // fp32 input rows a block holds (read from L2 for every weight tile)

// y[m, r] for m < mb, r < nr: x [mb, K] (rows ldx apart) times nr decoded weight rows w [nr, K].
template <int mb, int nr, typename Out>
QUANT_AVX512 void tile_512(const float* x, int64_t ldx, const float* w, const float* bias, Out* y, int64_t ldy,
                           int64_t K) {
  __m512 acc[nr][mb];
  for (int r = 0; r < nr; r++)
    for (int m = 0; m < mb; m++) acc[r][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 wv[nr];
    for (int r = 0; r < nr; r++) wv[r] = _mm512_loadu_ps(w + r * K + k);
    for (int m = 0; m < mb; m++) {
      const __m512 xv = _mm512_loadu_ps(x + m * ldx + k);
      for (int r = 0; r < nr; r++) acc[r][m] = _mm512_fmadd_ps(xv, wv[r], acc[r][m]);
    }
  }
  for (int r = 0; r < nr; r++)
    for (int m = 0; m < mb; m++)
      store(y + m * ldy + r, _mm512_reduce_add_ps(acc[r][m]) + (bias ? bias[r] : 0.0f));
}

template <int nr, typename Out>
QUANT_AVX512 void tile_rows_512(int64_t M, const float* x, int64_t K, const float* w, const float* bias, Out* y,
                                int64_t N) {
  int64_t m = 0;
  for (; m + TILE_M <= M; m += TILE_M) tile_512<TILE_M, nr>(x + m * K, K, w, bias, y + m * N, N, K);
  switch (M - m) {
    case 5: tile_512<5, nr>(x + m * K, K, w, bias, y + m * N, N, K); break;
    case 4: tile_512<4, nr>(x + m * K, K, w, bias, y + m * N, N, K); break;
    case 3: tile_512<3, nr>(x + m * K, K, w, bias, y + m * N, N, K); break;
    case 2: tile_512<2, nr>(x + m * K, K, w, bias, y + m * N, N, K); break;
    case 1: tile_512<1, nr>(x + m * K, K, w, bias, y + m * N, N, K); break;
    default: break;
  }
}

template <int type, typename Out>
QUANT_AVX512 void tiled_512(const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
                            int64_t N, int64_t K) {
  const int64_t block = std::max<int64_t>(TILE_M, TILED_X_BYTES / (K * 4) / TILE_M * TILE_M);
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    std::vector<float> decoded(TILE_N * K);
    for (int64_t m0 = 0; m0 < M; m0 += block) {
      const int64_t mb = std::min(block, M - m0);
      for (int64_t n = first; n < last; n += TILE_N) {
        const int64_t nr = std::min<int64_t>(TILE_N, last - n);
        for (int64_t r = 0; r < nr; r++) decode_row<type>(w + (n + r) * row_bytes, K, decoded.data() + r * K);
        const float* b = bias ? bias + n : nullptr;
        const float* xm = x + m0 * K;
        Out* ym = y + m0 * N + n;
        switch (nr) {
          case 4: tile_rows_512<4>(mb, xm, K, decoded.data(), b, ym, N); break;
          case 3: tile_rows_512<3>(mb, xm, K, decoded.data(), b, ym, N); break;
          case 2: tile_rows_512<2>(mb, xm, K, decoded.data(), b, ym, N); break;
          default: tile_rows_512<1>(mb, xm, K, decoded.data(), b, ym, N); break;
        }
      }
    }
  });
}

// Input rows in chunks, each over the run of weight rows; every chunk decodes the groups again (cheap next to its
// FMAs), and every output element takes the same operations whatever the chunk. Chunks of 16 rows while their
// fp32 rows fit in L1, else of 8 (with 2 weight rows a pass, each input vector loaded from L2 serves both).
template <int type, typename Out>
QUANT_AVX512 void qgemm_512(const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
                            int64_t N, int64_t K) {
  if (M >= TILED_MIN_ROWS) return tiled_512<type, Out>(x, w, row_bytes, bias, y, M, N, K);
  const int64_t chunk = MAX_FUSED_512 * K * 4 <= L1_ROWS_BYTES ? MAX_FUSED_512 : 8;
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    for (int64_t m = 0; m < M; m += chunk)
      fused_rows_512<type, Out>(std::min(chunk, M - m), x + m * K, w, row_bytes, bias, y + m * N, N, K, first, last);
  });
}

template <typename Out>
void qgemm_any_512(int type, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y,
                   int64_t M, int64_t N, int64_t K) {
  switch (type) {
    case Q8_0: qgemm_512<Q8_0>(x, w, row_bytes, bias, y, M, N, K); break;
    case Q5_0: qgemm_512<Q5_0>(x, w, row_bytes, bias, y, M, N, K); break;
    case Q4_K: qgemm_512<Q4_K>(x, w, row_bytes, bias, y, M, N, K); break;
    default: qgemm_512<Q6_K>(x, w, row_bytes, bias, y, M, N, K); break;
  }
}

}  // namespace quant
