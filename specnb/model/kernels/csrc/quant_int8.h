// Few-row linear layers over GGUF blocks with int8 activations: an option beside quant.h's exact path
// (load_model(..., weights="gguf-int8")), for AVX512 CPUs with VNNI, on Q5_0, Q4_K and Q6_K blocks (Q8_0 keeps the
// exact path: its codes are int8 already, and it was faster there; docs/forward_pass.md).
//
// quant.h converts every weight to fp32 and multiplies in fp32. Here each input row is rounded to int8 with one
// fp32 scale per 64 values (as llama.cpp rounds its activations), and a weight's small unsigned integer code
// multiplies them directly: vpdpbusd sums four code x activation products per int32 lane, 64 weights per
// instruction. Per chunk of 64 weights and input row:
//   y += dx * sum_lanes(scale_lane * dot_lane) - sum_16(offset_16 * xs_16)
// where a format writes each weight as scale * code - offset (offset shared by 16 weights), dx is the chunk's
// activation scale and xs_16 dx times the sum of the row's 16 int8 values there. Rounding the activations changes
// the model, so this route has its own greedy references; every output element still depends only on its own
// row, in one fixed order, so rows stay bit-independent and speculation over it equals its own AR.

#pragma once

#include "quant.h"

namespace quant {

constexpr int64_t CHUNK = 64;     // weights per vpdpbusd, and activation values per scale
constexpr int MAX_ROWS_INT8 = 8;  // input rows per pass over the weights: 8 zmm + 8 xmm accumulators

#define QUANT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

// Q4_K's 64-byte load of a half block gives its codes as [weights 0-31, 64-95] (low nibbles), then [32-63, 96-127]
// (high nibbles): its activations are stored in that order, each chunk of 64 with its own scale.
inline int64_t stored_q4k(int64_t i) {  // position in the stored order of the value at natural index i
  const int64_t half = i / 128, sub = i % 128 / 32, lane = i % 32;
  return half * 128 + (sub % 2) * 64 + (sub / 2) * 32 + lane;
}

// Input rows [M, K] rounded to int8, in the weight format's stored order: q [M, K], dx [M, K / CHUNK] each
// chunk's scale (max |x| / 127), xs [M, K / 16] dx times the sum of each 16 stored values.
struct QRows {
  std::vector<int8_t> q;
  std::vector<float> dx, xs;
};

QUANT_VNNI inline QRows quantize_rows(const float* x, int64_t M, int64_t K, bool q4k_order) {
  QRows r{std::vector<int8_t>(M * K), std::vector<float>(M * K / CHUNK), std::vector<float>(M * K / 16)};
  std::vector<float> stored(K);
  for (int64_t m = 0; m < M; m++) {
    const float* v = x + m * K;
    if (q4k_order) {
      for (int64_t i = 0; i < K; i += 32) std::memcpy(stored.data() + stored_q4k(i), v + i, 32 * sizeof(float));
      v = stored.data();
    }
    for (int64_t c = 0; c < K / CHUNK; c++) {
      const float* chunk = v + c * CHUNK;
      __m512 amax = _mm512_setzero_ps();
      for (int j = 0; j < CHUNK; j += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(chunk + j)));
      const float top = _mm512_reduce_max_ps(amax);
      const float d = top / 127.0f, id = top > 0.0f ? 127.0f / top : 0.0f;
      r.dx[m * (K / CHUNK) + c] = d;
      for (int j = 0; j < CHUNK; j += 16) {  // round to nearest even, as the default MXCSR does
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(chunk + j), _mm512_set1_ps(id)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + m * K + c * CHUNK + j), _mm512_cvtsepi32_epi8(q));
        r.xs[m * (K / 16) + (c * CHUNK + j) / 16] = d * float(_mm512_reduce_add_epi32(q));
      }
    }
  }
  return r;
}

// One chunk of 64 weights of a row: their unsigned codes, the fp32 scale of each int32 lane (4 weights), and the
// offsets of its 4 groups of 16 (weight = scale * code - offset), all in the stored order.
struct Chunk {
  __m512i codes;
  __m512 scale;
  __m128 offset;
};

// A K-quant block's scales as vectors, from which each chunk's lane scales and offsets are one permute each:
// Q4_K's 8 group scales and offsets (lanes 0-7), Q6_K's 16 scales (one per 16 weights) and their offsets.
struct BlockScales {
  __m512 scale, offset;
};

template <int type>
QUANT_VNNI inline __attribute__((always_inline)) BlockScales block_vectors(const uint8_t* p) {
  if constexpr (type == Q4_K) {
    Scales s;
    block_scales<Q4_K>(p, s);
    return {_mm512_castps256_ps512(_mm256_loadu_ps(s.lo)), _mm512_castps256_ps512(_mm256_loadu_ps(s.off))};
  } else {  // Q6_K: d * sc, the gguf package's product, in natural order; offset 32 * d * sc
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(half(p + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)))));
    return {scale, _mm512_mul_ps(_mm512_set1_ps(32.0f), scale)};
  }
}

// Chunk cb (0-3) of the K-quant block at p, whose scales are v.
template <int type>
QUANT_VNNI inline __attribute__((always_inline)) void decode_chunk(const uint8_t* p, int cb, const BlockScales& v,
                                                                 Chunk& out) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const int h = cb / 2, high = cb % 2;
  if constexpr (type == Q4_K) {  // groups 4h, 4h + 2 (low nibbles) or 4h + 1, 4h + 3 (high): lo[g] * u - off[g]
    const int g = 4 * h + high;
    prefetch(p + 16 + 64 * h);
    const __m512i raw = _mm512_loadu_si512(p + 16 + 64 * h);
    out.codes = _mm512_and_si512(high ? _mm512_srli_epi16(raw, 4) : raw, nibble);
    const __m512i lanes = _mm512_setr_epi32(g, g, g, g, g, g, g, g, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2,
                                            g + 2);
    out.scale = _mm512_permutexvar_ps(lanes, v.scale);
    out.offset = _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(g, g, g + 2, g + 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v.offset));
  } else {  // Q6_K: weights 128h + 64 high .. + 63 of the block, scales 4cb .. 4cb + 3: d * sc * (u - 32)
    prefetch(p + 64 * h);
    const __m512i raw = _mm512_loadu_si512(p + 64 * h);  // low nibbles: weights 0-63 of the half, high: 64-127
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    // 2-bit pairs of qh byte l: weights l, 32 + l, 64 + l, 96 + l of the half, moved to bits 4-5
    const __m512i bits = high ? _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1)
                              : _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)),
                                                   _mm256_slli_epi16(qh, 2), 1);
    out.codes = _mm512_or_si512(_mm512_and_si512(high ? _mm512_srli_epi16(raw, 4) : raw, nibble),
                                _mm512_and_si512(bits, _mm512_set1_epi8(0x30)));
    const int f = 4 * cb;
    out.scale = _mm512_permutexvar_ps(_mm512_setr_epi32(f, f, f, f, f + 1, f + 1, f + 1, f + 1, f + 2, f + 2, f + 2,
                                                        f + 2, f + 3, f + 3, f + 3, f + 3), v.scale);
    out.offset = _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(f, f + 1, f + 2, f + 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v.offset));
  }
}

// Chunk c of a Q5_0 row: blocks 2c and 2c + 1, weight = d * (u - 16).
QUANT_VNNI inline __attribute__((always_inline)) void decode_pair(const uint8_t* row, int64_t c, Chunk& out) {
  constexpr Format f = format(Q5_0);
  const uint8_t* p = row + 2 * c * f.bytes;
  prefetch(p);
  uint16_t h0, h1;
  std::memcpy(&h0, p, 2);
  std::memcpy(&h1, p + f.bytes, 2);
  const __m128 d = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(h0), h1, 1));  // d0, d1
  // decode_group gives the signed q; the unsigned code is q + 16
  const __m256i shift = _mm256_set1_epi8(16);
  out.codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_add_epi8(decode_group<Q5_0>(p, 0), shift)),
                                 _mm256_add_epi8(decode_group<Q5_0>(p + f.bytes, 0), shift), 1);
  out.scale = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                    _mm512_castps128_ps512(d));
  out.offset = _mm_mul_ps(_mm_set1_ps(16.0f), _mm_permute_ps(d, 0x50));  // d0 d0 d1 d1
}

// acc += dx * sum(scale * dot) and offs += offset * xs for chunk c of mb quantized rows (q, dx, xs: first row).
template <int mb>
QUANT_VNNI inline __attribute__((always_inline)) void accumulate_int8(const Chunk& w, const int8_t* q, const float* dx,
                                                                    const float* xs, int64_t c, int64_t K,
                                                                    __m512* acc, __m128* offs) {
  for (int m = 0; m < mb; m++) {
    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.codes, _mm512_loadu_si512(q + m * K + c * CHUNK));
    acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), w.scale), _mm512_set1_ps(dx[m * (K / CHUNK) + c]),
                             acc[m]);
    offs[m] = _mm_fmadd_ps(w.offset, _mm_loadu_ps(xs + m * (K / 16) + 4 * c), offs[m]);
  }
}

// y[m] for m < mb: one weight row times the quantized rows (q, dx, xs offset to the first of them).
template <int type, int mb, typename Out>
QUANT_VNNI void dot_rows_int8(const int8_t* q, const float* dx, const float* xs, const uint8_t* row, float bias,
                              Out* y, int64_t ldy, int64_t K) {
  __m512 acc[mb];
  __m128 offs[mb];
  for (int m = 0; m < mb; m++) acc[m] = _mm512_setzero_ps(), offs[m] = _mm_setzero_ps();
  if constexpr (type == Q5_0) {
    for (int64_t c = 0; c < K / CHUNK; c++) {
      Chunk w;
      decode_pair(row, c, w);
      accumulate_int8<mb>(w, q, dx, xs, c, K, acc, offs);
    }
  } else {
    constexpr Format f = format(type);
    for (int64_t b = 0; b < K / f.weights; b++) {
      const BlockScales v = block_vectors<type>(row + b * f.bytes);
#pragma GCC unroll 4
      for (int cb = 0; cb < 4; cb++) {
        Chunk w;
        decode_chunk<type>(row + b * f.bytes, cb, v, w);
        accumulate_int8<mb>(w, q, dx, xs, 4 * b + cb, K, acc, offs);
      }
    }
  }
  for (int m = 0; m < mb; m++) {
    __m128 o = _mm_add_ps(offs[m], _mm_movehl_ps(offs[m], offs[m]));
    o = _mm_add_ss(o, _mm_movehdup_ps(o));
    store(y + m * ldy, (_mm512_reduce_add_ps(acc[m]) - _mm_cvtss_f32(o)) + bias);
  }
}

template <int type, typename Out, int mb = 1>
QUANT_VNNI void rows_int8(int64_t rows, const QRows& r, int64_t m0, const uint8_t* w, int64_t row_bytes,
                          const float* bias, Out* y, int64_t N, int64_t K, int64_t first, int64_t last) {
  if constexpr (mb <= MAX_ROWS_INT8) {
    if (rows != mb) return rows_int8<type, Out, mb + 1>(rows, r, m0, w, row_bytes, bias, y, N, K, first, last);
    for (int64_t n = first; n < last; n++)
      dot_rows_int8<type, mb>(r.q.data() + m0 * K, r.dx.data() + m0 * (K / CHUNK), r.xs.data() + m0 * (K / 16),
                              w + n * row_bytes, bias ? bias[n] : 0.0f, y + m0 * N + n, N, K);
  }
}

template <int type, typename Out>
QUANT_VNNI void qgemm_int8(const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
                           int64_t N, int64_t K) {
  const QRows r = quantize_rows(x, M, K, type == Q4_K);
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    for (int64_t m = 0; m < M; m += MAX_ROWS_INT8)
      rows_int8<type, Out>(std::min<int64_t>(MAX_ROWS_INT8, M - m), r, m, w, row_bytes, bias, y, N, K, first, last);
  });
}

template <typename Out>
void qgemm_any_int8(int type, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y,
                    int64_t M, int64_t N, int64_t K) {
  TORCH_CHECK(K % CHUNK == 0, "quant.linear (int8 activations): K = ", K, " is not a multiple of ", CHUNK);
  TORCH_CHECK(type != Q8_0, "quant.linear: Q8_0 has no int8-activation route");
  switch (type) {
    case Q5_0: qgemm_int8<Q5_0>(x, w, row_bytes, bias, y, M, N, K); break;
    case Q4_K: qgemm_int8<Q4_K>(x, w, row_bytes, bias, y, M, N, K); break;
    default: qgemm_int8<Q6_K>(x, w, row_bytes, bias, y, M, N, K); break;
  }
}

}  // namespace quant
