// Linear layers over GGUF blocks with int8 activations (load_model(..., weights="gguf-int8")): the route that
// brings a call of several rows to the machine's floor, for Q8_0, Q5_0, Q4_K and Q6_K: with vpdpbusd on AVX512
// CPUs with VNNI, with vpmaddubsw / vpmaddwd on AVX2 ones (the same bits; "the kernel, AVX2" below).
//
// quant.h converts every weight to fp32 and runs one fp32 FMA per weight and input row: 16 rows cost ~16x the
// FMAs of one, several times the time of reading the blocks. Here a weight's small integer code multiplies the
// input rows rounded to int8 directly, with vpdpbusd (64 multiply-adds an instruction), and each code is decoded
// once per call for every row of the call:
//
//   * Repacked once at load (repack()): 16 weight rows interleaved, one per int32 lane of a zmm register, so one
//     64-byte load holds 4 consecutive codes of 16 rows, as unsigned bytes; the bit planes stay as packed as in
//     the file (the repacked tensor has the file's size). Each output is a lane: no horizontal sums.
//   * Activations rounded to int8 per block of the weight format (32 values for Q8_0 / Q5_0, 256 for the
//     K-quants, as llama.cpp's Q8_0 / Q8_K), one fp32 scale dx each; every 4 of a row's int8 values are
//     broadcast to the 16 lanes, so a row costs one vpdpbusd per 64 weights.
//   * Per block and input row, the integer dot of the codes is exact in int32; the format's offset
//     (weight = scale * (code - offset), or Q4_K's scale * code - min) is the row's sum of int8 values times the
//     offset, subtracted in int32 (or, for Q4_K's mins, added in fp32 at the block's end); the block's result is
//     scaled once in fp32: acc = fma(float(dot), d * dx, acc).
//
// Rows are bit-independent: an output element takes the same operations, in the same order, whatever the number of
// rows in the call and wherever its row sits (int32 sums are exact; the fp32 steps run per block in order, bias
// added last, one rounding to the output dtype). Rounding the activations changes the model, so this route has its
// own greedy references; speculation over it equals its own AR token for token.
// Threads: ATen's intra-op pool, tiles of 16 weight rows handed out in runs (quant.h's for_each_row_run).

#pragma once

#include "quant.h"

namespace quant {

constexpr int64_t LANES = 16;    // weight rows per tile: one per int32 lane
// Runs of tiles a thread takes from the shared counter in a call of several rows (one row: RUNS_PER_THREAD). Such a
// call computes longer per byte; fewer, longer runs cost less (docs/kernels.md).
constexpr int64_t MULTI_ROW_RUNS_PER_THREAD = 2;

#define QUANT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

// A tile's layout per block of the format (16 weight rows x the block's weights), byte offsets:
//   Q8_0  d fp16[16] @0 | codes @32: step s (k = 4s..4s+3) at 32 + 64s, lane r = row r's 4 codes (q + 128)
//   Q5_0  d fp16[16] @0 | high bits @32: lane r dword, bit 8b + s = fifth bit of k = 4s + b
//         | nibbles @96: zmm z (k = 8z..8z+7), lane r byte b: low nibble k = 8z + b, high nibble k = 8z + 4 + b
//   Q4_K  d fp16[16] @0 | dmin fp16[16] @32 | sc [8][16] u8 @64 | m [4 pairs][16][2] u8 @192 | nibbles @320
//   Q6_K  d fp16[16] @0 | sc [16][16] i8 @32 | nibbles @288 | high pairs @2336: zmm t (k = 16t..16t+15),
//         lane r byte b, bits 2u..2u+1 = high 2 bits of k = 16t + 4u + b
// Each is 16x the file's block but Q4_K's (its 6-bit scales and mins as bytes: 148 bytes a row's block, not 144).
template <int type>
struct Tile {
  static constexpr int64_t weights = format(type).weights, bytes = type == Q4_K ? 2368 : LANES * format(type).bytes;
  static constexpr int64_t sub = type == Q6_K ? 16 : 32;  // weights per scale (and per int32 dot)
  static constexpr int32_t offset = type == Q8_0 ? 128 : type == Q5_0 ? 16 : type == Q6_K ? 32 : 0;
  static constexpr int64_t nibbles = type == Q5_0 ? 96 : type == Q4_K ? 320 : 288, high = type == Q5_0 ? 32 : 2336;
  // input rows per pass over a tile, each code decoded once for all of them: as many as keep their accumulators in
  // the 32 zmm registers (the K-quants hold one more per row, the block's integer sum)
  static constexpr int rows = type == Q8_0 || type == Q5_0 ? 16 : 8;
};

// ----------------------------------------------------------------------------------------------- repacking

// The unsigned codes of one block (code k of the block's weights) and its scales, as the file stores them.
struct BlockCodes {
  uint8_t code[256];
  uint16_t d = 0, dmin = 0;  // fp16 bits
  uint8_t sc[16] = {}, m[8] = {};  // Q4_K: 6-bit scales and mins of 8 groups; Q6_K: int8 scales of 16
};

template <int type>
void unpack_block(const uint8_t* p, BlockCodes& b) {
  std::memcpy(&b.d, type == Q6_K ? p + 208 : p, 2);
  if constexpr (type == Q8_0) {
    for (int k = 0; k < 32; k++) b.code[k] = uint8_t(int(int8_t(p[2 + k])) + 128);
  } else if constexpr (type == Q5_0) {
    uint32_t high;
    std::memcpy(&high, p + 2, 4);
    for (int k = 0; k < 32; k++)
      b.code[k] = uint8_t(((k < 16 ? p[6 + k] : p[6 + k - 16] >> 4) & 0x0f) | (((high >> k) & 1) << 4));
  } else if constexpr (type == Q4_K) {  // ggml's get_scale_min_k4
    std::memcpy(&b.dmin, p + 2, 2);
    const uint8_t* s = p + 4;
    for (int j = 0; j < 8; j++) {
      b.sc[j] = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
      b.m[j] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) {
        b.code[64 * c + l] = p[16 + 32 * c + l] & 0x0f;
        b.code[64 * c + 32 + l] = p[16 + 32 * c + l] >> 4;
      }
  } else {  // Q6_K: ql[128], qh[64], scales[16], d
    std::memcpy(b.sc, p + 192, 16);
    for (int n = 0; n < 2; n++)
      for (int l = 0; l < 32; l++) {
        const uint8_t* ql = p + 64 * n;
        const uint8_t qh = p[128 + 32 * n + l];
        b.code[128 * n + l] = (ql[l] & 0x0f) | ((qh & 3) << 4);
        b.code[128 * n + l + 32] = (ql[l + 32] & 0x0f) | (((qh >> 2) & 3) << 4);
        b.code[128 * n + l + 64] = (ql[l] >> 4) | (((qh >> 4) & 3) << 4);
        b.code[128 * n + l + 96] = (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4);
      }
  }
}

// Lane r's codes of one block into the tile block at t (the layout above).
template <int type>
void pack_lane(const BlockCodes& b, int r, uint8_t* t) {
  using T = Tile<type>;
  std::memcpy(t + 2 * r, &b.d, 2);
  if constexpr (type == Q8_0) {
    for (int k = 0; k < 32; k++) t[32 + 64 * (k / 4) + 4 * r + k % 4] = b.code[k];
    return;
  }
  if constexpr (type == Q5_0) {
    uint32_t high = 0;
    for (int k = 0; k < 32; k++) high |= uint32_t(b.code[k] >> 4) << (8 * (k % 4) + k / 4);
    std::memcpy(t + T::high + 4 * r, &high, 4);
  }
  if constexpr (type == Q4_K) {
    std::memcpy(t + 32 + 2 * r, &b.dmin, 2);
    for (int j = 0; j < 8; j++) t[64 + 16 * j + r] = b.sc[j];
    for (int j = 0; j < 8; j++) t[192 + 32 * (j / 2) + 2 * r + j % 2] = b.m[j];
  }
  if constexpr (type == Q6_K) {
    for (int j = 0; j < 16; j++) t[32 + 16 * j + r] = b.sc[j];
    for (int k = 0; k < 256; k++) {
      const int tt = k / 16, u = k % 16 / 4, byte = k % 4;
      t[T::high + 64 * tt + 4 * r + byte] |= uint8_t((b.code[k] >> 4) << (2 * u));
    }
  }
  for (int k = 0; k < T::weights; k++) {  // nibbles: zmm z = k / 8, byte b = k % 4, high nibble for k % 8 >= 4
    uint8_t& byte = t[T::nibbles + 64 * (k / 8) + 4 * r + k % 4];
    byte |= uint8_t((b.code[k] & 0x0f) << (k % 8 >= 4 ? 4 : 0));
  }
}

template <int type>
void repack_rows(const uint8_t* w, int64_t row_bytes, uint8_t* out, int64_t tiles) {
  constexpr Format f = format(type);
  const int64_t blocks = row_bytes / f.bytes;
  static_assert(Tile<type>::nibbles + Tile<type>::weights * LANES / 2 <= Tile<type>::bytes);
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    BlockCodes b;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t blk = 0; blk < blocks; blk++) {
        uint8_t* tile = out + (t * blocks + blk) * Tile<type>::bytes;
        std::memset(tile, 0, Tile<type>::bytes);
        for (int r = 0; r < LANES; r++) {
          unpack_block<type>(w + (t * LANES + r) * row_bytes + blk * f.bytes, b);
          pack_lane<type>(b, r, tile);
        }
      }
  });
}

// ----------------------------------------------------------------------------------------------- activations

// Input rows [M, K] rounded to int8 per block of the format (B values): each block's scale dx (max |x| / 127, values
// rounded to nearest even), and per group of `sub` values `sums`: for formats with an offset, -offset times the
// group's int8 sum (a dot's starting value); for Q4_K, the sums of two consecutive groups of 32 as int16 pairs (the
// mins' multipliers). Stored chunk by chunk of Tile::rows rows, each chunk's rows interleaved (rows = the chunk's
// row count): q as int32 [K / 4][rows] (4 int8 values each), dx [K / B][rows], sums [K / sub (/ 2)][rows], so that a
// kernel reads every row's operands at constant offsets from one pointer.
struct QRows {
  std::vector<int32_t> q;
  std::vector<float> dx;
  std::vector<int32_t> sums;
};

// 16 input values as fp32 (bf16 widened exactly).
inline __attribute__((always_inline)) QUANT_VNNI __m512 load16(const float* v) { return _mm512_loadu_ps(v); }
inline __attribute__((always_inline)) QUANT_VNNI __m512 load16(const at::BFloat16* v) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// A row's K input values at v rounded to int8 per block of B: q[K] = x * (127 / max|x|) to nearest even (as the
// default MXCSR rounds), dx[K / B] = max|x| / 127, group[K / sub] the int8 sums of each group of sub values.
template <typename In>
QUANT_VNNI void round_row_512(const In* v, int64_t K, int64_t B, int64_t sub, int8_t* q, float* dx, int32_t* group) {
  for (int64_t c = 0; c < K; c += B) {
    __m512 amax = _mm512_setzero_ps();
    for (int64_t j = c; j < c + B; j += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(v + j)));
    const float top = _mm512_reduce_max_ps(amax);
    const __m512 id = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    dx[c / B] = top / 127.0f;
    for (int64_t j = c; j < c + B; j += 16) {
      const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(load16(v + j), id));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtsepi32_epi8(qi));
      group[j / sub] = (j % sub ? group[j / sub] : 0) + _mm512_reduce_add_epi32(qi);
    }
  }
}

// The same rounding 8 values at a time (AVX2): the same bits.
template <typename In>
void round_row_256(const In* v, int64_t K, int64_t B, int64_t sub, int8_t* q, float* dx, int32_t* group) {
  const auto load8 = [](const In* p) {
    if constexpr (std::is_same_v<In, float>) return _mm256_loadu_ps(p);
    else return widen8(reinterpret_cast<const bf16*>(p));
  };
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  alignas(32) float lanes[8];
  alignas(32) int32_t qi[8];
  for (int64_t c = 0; c < K; c += B) {
    __m256 amax = _mm256_setzero_ps();
    for (int64_t j = c; j < c + B; j += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(load8(v + j), abs_mask));
    _mm256_store_ps(lanes, amax);
    float top = 0.0f;
    for (float l : lanes) top = std::max(top, l);
    const __m256 id = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    dx[c / B] = top / 127.0f;
    for (int64_t j = c; j < c + B; j += 8) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(qi), _mm256_cvtps_epi32(_mm256_mul_ps(load8(v + j), id)));
      int32_t sum = 0;
      for (int u = 0; u < 8; u++) q[j + u] = int8_t(qi[u]), sum += qi[u];  // |qi| <= 127
      group[j / sub] = (j % sub ? group[j / sub] : 0) + sum;
    }
  }
}

// Rows m0..m1-1 (whole chunks of R rows, but the last) into r: each chunk writes only its own part of q, dx and
// sums, so chunks may run in parallel. vnni: round with AVX512 (else AVX2; the same bits).
template <int type, int R, bool vnni, typename In>
void quantize_chunks(const In* x, int64_t M, int64_t K, int64_t m0, int64_t m1, QRows& r) {
  using T = Tile<type>;
  const int64_t B = T::weights, groups = K / T::sub, slots = type == Q4_K ? groups / 2 : groups;
  std::vector<int32_t> group(groups);
  std::vector<int8_t> q(K);
  std::vector<float> dx(K / B);
  for (int64_t m = m0; m < m1; m++) {
    const int64_t c0 = m / R * R, rows = std::min<int64_t>(R, M - c0), i = m - c0;
    if constexpr (vnni) round_row_512(x + m * K, K, B, T::sub, q.data(), dx.data(), group.data());
    else round_row_256(x + m * K, K, B, T::sub, q.data(), dx.data(), group.data());
    int32_t* qc = r.q.data() + c0 * K / 4;
    for (int64_t u = 0; u < K / 4; u++) std::memcpy(qc + u * rows + i, q.data() + 4 * u, 4);
    for (int64_t c = 0; c < K / B; c++) r.dx[c0 * (K / B) + c * rows + i] = dx[c];
    int32_t* sc = r.sums.data() + c0 * slots;
    if constexpr (type == Q4_K) {
      for (int64_t g = 0; g < groups; g += 2)
        sc[g / 2 * rows + i] = int32_t(uint32_t(uint16_t(group[g])) | (uint32_t(group[g + 1]) << 16));
    } else {
      for (int64_t g = 0; g < groups; g++) sc[g * rows + i] = -T::offset * group[g];
    }
  }
}

constexpr int64_t QUANTIZE_INLINE_CHUNKS = 4;  // calls of more chunks than this (prefills) round in parallel

// x [M, K] rounded for the tiles: chunks of R rows (Tile::rows for the AVX512 tiles, AVX2_ROWS for the AVX2 ones).
template <int type, int R, bool vnni, typename In>
QRows quantize_rows(const In* x, int64_t M, int64_t K) {
  using T = Tile<type>;
  const int64_t groups = K / T::sub, slots = type == Q4_K ? groups / 2 : groups;
  QRows r{std::vector<int32_t>(M * K / 4), std::vector<float>(M * K / T::weights), std::vector<int32_t>(M * slots)};
  at::parallel_for(0, (M + R - 1) / R, QUANTIZE_INLINE_CHUNKS, [&](int64_t k0, int64_t k1) {
    quantize_chunks<type, R, vnni, In>(x, M, K, k0 * R, std::min(M, k1 * R), r);
  });
  return r;
}

// ----------------------------------------------------------------------------------------------- the kernel

inline __attribute__((always_inline)) QUANT_VNNI __m512i low_nibbles(__m512i z) {
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}
inline __attribute__((always_inline)) QUANT_VNNI __m512i high_nibbles(__m512i z) {
  return _mm512_and_si512(_mm512_srli_epi16(z, 4), _mm512_set1_epi8(0x0f));
}

// Step s (k = 4s..4s+3 of the block, s < 8 for Q8_0 / Q5_0; of the group for K-quants) of the tile block at p:
// 16 lanes of 4 unsigned codes.
template <int type>
QUANT_VNNI inline __attribute__((always_inline)) __m512i step_codes(const uint8_t* p, int s) {
  using T = Tile<type>;
  if constexpr (type == Q8_0) {
    return _mm512_loadu_si512(p + 32 + 64 * s);
  } else {
    const __m512i z = _mm512_loadu_si512(p + T::nibbles + 64 * (s / 2));
    const __m512i nib = s % 2 ? high_nibbles(z) : low_nibbles(z);
    if constexpr (type == Q4_K) return nib;
    if constexpr (type == Q5_0) {
      const __m512i h = _mm512_loadu_si512(p + T::high);
      const __m512i moved = s <= 4 ? _mm512_slli_epi32(h, 4 - s) : _mm512_srli_epi32(h, s - 4);
      return _mm512_or_si512(nib, _mm512_and_si512(moved, _mm512_set1_epi8(0x10)));
    } else {  // Q6_K
      const __m512i h = _mm512_loadu_si512(p + T::high + 64 * (s / 4));
      const int u = s % 4;
      const __m512i moved = u < 2 ? _mm512_slli_epi32(h, 4 - 2 * u) : u == 2 ? h : _mm512_srli_epi32(h, 2);
      return _mm512_or_si512(nib, _mm512_and_si512(moved, _mm512_set1_epi8(0x30)));
    }
  }
}

// dot + the 16 lanes of w times the 4 int8 values at q broadcast to every lane: vpdpbusd with the broadcast folded
// into its memory operand (compilers load it into a register first, one more instruction a step)
QUANT_VNNI inline __attribute__((always_inline)) __m512i dpbusd_bcast(__m512i dot, __m512i w, const int32_t* q) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot) : "v"(w), "m"(*q));
  return dot;
}

// 16 fp32 outputs to y (float or bf16, at::BFloat16's rounding: nearest even, every NaN 0x7fc0)
QUANT_VNNI inline void store16(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
QUANT_VNNI inline void store16(at::BFloat16* y, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i half = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7fff));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, half), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(r));
}

// dot[m] += the codes of steps first..first + S - 1 of the tile block at p times row m's int8 values there (q: the
// chunk's interleaved values at the first step): the rows side by side, each step's codes decoded once for all.
template <int type, int mb, int S>
QUANT_VNNI inline __attribute__((always_inline)) void dots(const uint8_t* p, int first, const int32_t* q, __m512i* dot) {
#pragma GCC unroll 16
  for (int s = 0; s < S; s++) {
    const __m512i w = step_codes<type>(p, first + s);
#pragma GCC unroll 16
    for (int m = 0; m < mb; m++) dot[m] = dpbusd_bcast(dot[m], w, q + s * mb + m);
  }
}

// y[m, 0..15] for m < mb: one tile (16 weight rows, all K) times a chunk of mb quantized rows (q, dx, sums: the
// chunk's, QRows' layout). Per block and row, acc = fma(float(dot), d * dx, acc), dot exact in int32. fetch: prefetch
// the weights ahead (the first chunk of a call's rows; the later ones find the tile in cache).
template <int type, int mb, typename Out>
QUANT_VNNI void tile_rows(const int32_t* q, const float* dx, const int32_t* sums, const uint8_t* tile,
                          const float* bias, Out* y, int64_t ldy, int64_t K, bool fetch) {
  using T = Tile<type>;
  const int64_t blocks = K / T::weights;
  __m512 acc[mb];
  __m512i dot[mb];
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b++) {
    const uint8_t* p = tile + b * T::bytes;
    const int32_t* qb = q + b * (T::weights / 4) * mb;
    const float* dxb = dx + b * mb;
    if (fetch)
      for (int64_t line = 0; line < T::bytes; line += 64) prefetch(p + line);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    if constexpr (type == Q8_0 || type == Q5_0) {  // one group: dot from -offset * sum
#pragma GCC unroll 16
      for (int m = 0; m < mb; m++) dot[m] = _mm512_set1_epi32(sums[b * mb + m]);
      dots<type, mb, 8>(p, 0, qb, dot);
#pragma GCC unroll 16
      for (int m = 0; m < mb; m++)
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), _mm512_mul_ps(d, _mm512_set1_ps(dxb[m])), acc[m]);
    } else {  // K-quants: the groups' dots times their integer scales, summed in int32 over the block
      constexpr int G = 256 / T::sub, S = T::sub / 4;  // groups per block, steps per group
      __m512i isum[mb];
#pragma GCC unroll 16
      for (int m = 0; m < mb; m++) isum[m] = _mm512_setzero_si512();
      for (int g = 0; g < G; g++) {
#pragma GCC unroll 16
        for (int m = 0; m < mb; m++)
          dot[m] = type == Q4_K ? _mm512_setzero_si512() : _mm512_set1_epi32(sums[(b * G + g) * mb + m]);
        dots<type, mb, S>(p, g * S, qb + g * S * mb, dot);
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (type == Q4_K ? 64 : 32) + 16 * g));
        const __m512i sc = type == Q4_K ? _mm512_cvtepu8_epi32(sc8) : _mm512_cvtepi8_epi32(sc8);
#pragma GCC unroll 16
        for (int m = 0; m < mb; m++) isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(dot[m], sc));
      }
      if constexpr (type == Q4_K) {  // minus dmin * dx * the sum over groups of m * (the group's int8 sum)
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
        __m512i mins[4];
        for (int i = 0; i < 4; i++)
          mins[i] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 192 + 32 * i)));
#pragma GCC unroll 16
        for (int m = 0; m < mb; m++) {
          __m512i msum = _mm512_madd_epi16(mins[0], _mm512_set1_epi32(sums[(b * 4) * mb + m]));
          for (int i = 1; i < 4; i++)
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mins[i], _mm512_set1_epi32(sums[(b * 4 + i) * mb + m])));
          const __m512 dxm = _mm512_set1_ps(dxb[m]);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, dxm), acc[m]);
          acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dxm), acc[m]);
        }
      } else {
#pragma GCC unroll 16
        for (int m = 0; m < mb; m++)
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, _mm512_set1_ps(dxb[m])), acc[m]);
      }
    }
  }
  const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int m = 0; m < mb; m++) store16(y + m * ldy, _mm512_add_ps(acc[m], bv));
}

template <int type, typename Out, int mb = 1>
QUANT_VNNI void rows_int8(int64_t rows, const QRows& r, int64_t m0, const uint8_t* tile, const float* bias, Out* y,
                          int64_t N, int64_t K) {
  if constexpr (mb <= Tile<type>::rows) {
    if (rows != mb) return rows_int8<type, Out, mb + 1>(rows, r, m0, tile, bias, y, N, K);
    using T = Tile<type>;
    const int64_t slots = type == Q4_K ? K / T::sub / 2 : K / T::sub;
    tile_rows<type, mb>(r.q.data() + m0 * K / 4, r.dx.data() + m0 * (K / T::weights), r.sums.data() + m0 * slots,
                        tile, bias, y + m0 * N, N, K, m0 == 0);
  }
}

// ----------------------------------------------------------------------------------------------- the kernel, AVX2

// CPUs without AVX512-VNNI run the same tiles in two halves of 8 lanes (ymm) with the same integers and the same fp32
// steps, so the same bits. A row's 4 int8 values are broadcast and multiplied with the codes by vpmaddubsw (unsigned
// times signed bytes, pairs summed in int16), several steps' pairs are summed in int16 while they cannot overflow,
// then widened to int32 by vpmaddwd: against ones (Q8_0, Q5_0), or against the group's scale (K-quants), which also
// applies the scale. Q8_0's codes are taken less their offset, as |q| times x with q's sign (vpsignb), since q + 128
// would overflow a pair; Q6_K's stay unsigned (0..63), their offset the group's -32 * sum of x times its scale.
constexpr int AVX2_ROWS = 4;  // input rows per pass over a half tile: their accumulators in the 16 ymm registers
// Up to this many rows pass over both halves of a tile at once. Q8_0 keeps no int16 pair sums across its steps, so
// four rows' integer sums for both halves fit the registers (their fp32 sums wait in L1 between blocks); the
// K-quants and Q5_0 spill their pair sums past two rows.
template <int type>
constexpr int avx2_both_halves = type == Q8_0 ? AVX2_ROWS : 2;

// Step s of half h (lanes 8h..8h+7) of the tile block at p: 8 lanes of 4 codes (step_codes' layout); Q8_0 less its
// offset (signed), the others unsigned.
template <int type>
inline __attribute__((always_inline)) __m256i step_codes8(const uint8_t* p, int s, int h) {
  using T = Tile<type>;
  if constexpr (type == Q8_0) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * s + 32 * h));
    return _mm256_xor_si256(z, _mm256_set1_epi8(char(0x80)));
  } else {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + T::nibbles + 64 * (s / 2) + 32 * h));
    const __m256i nib = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(z, 4) : z, _mm256_set1_epi8(0x0f));
    if constexpr (type == Q4_K) return nib;
    if constexpr (type == Q5_0) {
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + T::high + 32 * h));
      const __m256i moved = s <= 4 ? _mm256_slli_epi32(hb, 4 - s) : _mm256_srli_epi32(hb, s - 4);
      return _mm256_or_si256(nib, _mm256_and_si256(moved, _mm256_set1_epi8(0x10)));
    } else {  // Q6_K
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + T::high + 64 * (s / 4) + 32 * h));
      const int u = s % 4;
      const __m256i moved = u < 2 ? _mm256_slli_epi32(hb, 4 - 2 * u) : u == 2 ? hb : _mm256_srli_epi32(hb, 2);
      return _mm256_or_si256(nib, _mm256_and_si256(moved, _mm256_set1_epi8(0x30)));
    }
  }
}

// pairs[m] = the int16 pair sums of steps first..first + P - 1 of half h of the tile block at p times row m's int8
// values (q: the chunk's interleaved values at step first). Exact: a pair is at most 2 * 127 * the largest |code|
// (Q4_K 15, Q5_0 31, Q6_K 63, Q8_0 128), so P <= 8, 4, 2, 1 keeps every sum under 2^15.
template <int type, int mb, int P>
inline __attribute__((always_inline)) void pair_sums(const uint8_t* p, int first, int h, const int32_t* q,
                                                     __m256i* pairs) {
  static_assert(P <= (type == Q4_K ? 8 : type == Q8_0 ? 1 : type == Q6_K ? 2 : 4));
  constexpr bool sign = type == Q8_0;
#pragma GCC unroll 8
  for (int s = 0; s < P; s++) {
    const __m256i codes = step_codes8<type>(p, first + s, h);
    const __m256i w = sign ? _mm256_abs_epi8(codes) : codes;
#pragma GCC unroll 4
    for (int m = 0; m < mb; m++) {
      __m256i x = _mm256_set1_epi32(q[s * mb + m]);
      if constexpr (sign) x = _mm256_sign_epi8(x, codes);
      const __m256i product = _mm256_maddubs_epi16(w, x);
      pairs[m] = s == 0 ? product : _mm256_add_epi16(pairs[m], product);
      __asm__("" : "+x"(pairs[m]));  // summed in step order: each row's sum stays in one register
    }
  }
}

// A group's 8 lanes of scales (8 bytes at `at`, unsigned for Q4_K) as int16 pairs: the multiplier vpmaddwd applies.
template <int type>
inline __attribute__((always_inline)) __m256i scale_pairs(const uint8_t* at) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at));
  const __m128i twice = _mm_unpacklo_epi8(b, b);
  return type == Q4_K ? _mm256_cvtepu8_epi16(twice) : _mm256_cvtepi8_epi16(twice);
}

// dot + the int16 pairs times the multipliers, summed in int32 pairs (vpmaddwd), in the order of the calls (so that
// the compiler keeps one register a row rather than a tree of spilled products)
inline __attribute__((always_inline)) __m256i widened(__m256i dot, __m256i pairs, __m256i multipliers) {
  dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, multipliers));
  __asm__("" : "+x"(dot));
  return dot;
}

// tile_rows for halves h0..h0 + H - 1 of a tile (outputs 8h0..8(h0 + H) - 1) and a chunk of mb rows rounded in
// chunks of AVX2_ROWS. Both halves in one pass (H = 2) where their accumulators fit the registers: each 64-byte line
// of codes is then read once, while the stream from memory runs.
template <int type, int mb, int H, typename Out>
void half_tile_rows(const int32_t* q, const float* dx, const int32_t* sums, const uint8_t* tile, int h0,
                    const float* bias, Out* y, int64_t ldy, int64_t K, bool fetch) {
  using T = Tile<type>;
  const int64_t blocks = K / T::weights;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[H][mb];
  __m256i dot[H][mb], pairs[H][mb];
  const auto half8 = [](const uint8_t* at, int h) {  // 8 fp16 of half h at `at` as fp32
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 16 * h)));
  };
  for (int i = 0; i < H; i++)
#pragma GCC unroll 4
    for (int m = 0; m < mb; m++) acc[i][m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; b++) {
    const uint8_t* p = tile + b * T::bytes;
    const int32_t* qb = q + b * (T::weights / 4) * mb;
    const float* dxb = dx + b * mb;
    // Prefetched 4 KB ahead: a Q8_0 or Q5_0 block's 6-9 lines at its start, a K-quant block's 37-53 lines a share
    // per group, so that requests go out while the block computes (docs/kernels.md). Written out in each loop: a
    // lambda for it, left out of line by GCC, spilled the rows' sums at every call.
    constexpr int64_t lines = (T::bytes + 63) / 64;
    if constexpr (type == Q8_0 || type == Q5_0) {  // Q8_0 from zero (its codes signed), Q5_0 from -16 * sum
      constexpr int P = type == Q8_0 ? 1 : 4;
      if (fetch)
        for (int64_t line = 0; line < lines; line++) prefetch(p + 64 * line);
      for (int i = 0; i < H; i++)
#pragma GCC unroll 4
        for (int m = 0; m < mb; m++) dot[i][m] = _mm256_set1_epi32(type == Q8_0 ? 0 : sums[b * mb + m]);
#pragma GCC unroll 8
      for (int s = 0; s < 8; s += P)
        for (int i = 0; i < H; i++) {
          pair_sums<type, mb, P>(p, s, h0 + i, qb + s * mb, pairs[i]);
#pragma GCC unroll 4
          for (int m = 0; m < mb; m++) dot[i][m] = widened(dot[i][m], pairs[i][m], ones);
        }
      for (int i = 0; i < H; i++) {
        const __m256 d = half8(p, h0 + i);
#pragma GCC unroll 4
        for (int m = 0; m < mb; m++)
          acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][m]), _mm256_mul_ps(d, _mm256_set1_ps(dxb[m])),
                                      acc[i][m]);
      }
    } else {  // K-quants: each group's pair sums times its scale, summed in int32 over the block
      constexpr int G = 256 / T::sub, S = T::sub / 4, P = type == Q4_K ? S : 2;
      for (int i = 0; i < H; i++)
#pragma GCC unroll 4
        for (int m = 0; m < mb; m++) dot[i][m] = _mm256_setzero_si256();
      for (int g = 0; g < G; g++) {
        if (fetch)
          for (int64_t line = g * lines / G; line < (g + 1) * lines / G; line++) prefetch(p + 64 * line);
        for (int i = 0; i < H; i++) {
          const uint8_t* scales = p + (type == Q4_K ? 64 : 32) + 16 * g + 8 * (h0 + i);
          const __m256i sc = scale_pairs<type>(scales);
#pragma GCC unroll 4
          for (int s = 0; s < S; s += P) {
            pair_sums<type, mb, P>(p, g * S + s, h0 + i, qb + (g * S + s) * mb, pairs[i]);
#pragma GCC unroll 4
            for (int m = 0; m < mb; m++) dot[i][m] = widened(dot[i][m], pairs[i][m], sc);
          }
          if constexpr (type == Q6_K) {  // the offset: the group's -32 * sum of x times its scale
            const __m256i sc32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
#pragma GCC unroll 4
            for (int m = 0; m < mb; m++)
              dot[i][m] =
                  _mm256_add_epi32(dot[i][m], _mm256_mullo_epi32(sc32, _mm256_set1_epi32(sums[(b * G + g) * mb + m])));
          }
        }
      }
      for (int i = 0; i < H; i++) {
        const int h = h0 + i;
        const __m256 d = half8(p, h);
        if constexpr (type == Q4_K) {
          const __m256 dmin = half8(p + 32, h);
          __m256i mins[4];
          for (int j = 0; j < 4; j++)
            mins[j] =
                _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192 + 32 * j + 16 * h)));
#pragma GCC unroll 4
          for (int m = 0; m < mb; m++) {
            __m256i msum = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(sums[(b * 4) * mb + m]));
            for (int j = 1; j < 4; j++)
              msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[j], _mm256_set1_epi32(sums[(b * 4 + j) * mb + m])));
            const __m256 dxm = _mm256_set1_ps(dxb[m]);
            acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][m]), _mm256_mul_ps(d, dxm), acc[i][m]);
            acc[i][m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dxm), acc[i][m]);
          }
        } else {
#pragma GCC unroll 4
          for (int m = 0; m < mb; m++)
            acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][m]), _mm256_mul_ps(d, _mm256_set1_ps(dxb[m])),
                                        acc[i][m]);
        }
      }
    }
    if constexpr (H * mb > 4) __asm__ volatile("" : "+m"(acc));  // more than the registers hold: in L1 between blocks
  }
  for (int i = 0; i < H; i++) {
    const int h = h0 + i;
    const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int m = 0; m < mb; m++) store8(y + m * ldy + 8 * h, _mm256_add_ps(acc[i][m], bv));
  }
}

// Rows m0..m0 + rows - 1 (at most AVX2_ROWS) times halves h0..h0 + H - 1 of a tile.
template <int type, int H, typename Out, int mb = 1>
void rows_int8_avx2(int64_t rows, const QRows& r, int64_t m0, const uint8_t* tile, int h0, const float* bias, Out* y,
                    int64_t N, int64_t K) {
  if constexpr (mb <= (H == 2 ? avx2_both_halves<type> : AVX2_ROWS)) {
    if (rows != mb) return rows_int8_avx2<type, H, Out, mb + 1>(rows, r, m0, tile, h0, bias, y, N, K);
    using T = Tile<type>;
    const int64_t slots = type == Q4_K ? K / T::sub / 2 : K / T::sub;
    half_tile_rows<type, mb, H>(r.q.data() + m0 * K / 4, r.dx.data() + m0 * (K / T::weights),
                                r.sums.data() + m0 * slots, tile, h0, bias, y + m0 * N, N, K, m0 == 0 && h0 == 0);
  }
}

// ----------------------------------------------------------------------------------------------- a call

// One weight of a call: its repacked blocks w [tiles, tile bytes] of ggml type `type`, bias [16 * tiles] or null,
// its outputs at columns col .. col + 16 * tiles - 1 of the call's output. A call takes siblings that read the same
// input rows (q, k, v; gate, up) together: the rows rounded once per format, one pass of the threads over all tiles.
struct Part {
  const uint8_t* w;
  int64_t tile_bytes, tiles, col;
  const float* bias;
  int type;
};

inline int type_slot(int type) { return type == Q8_0 ? 0 : type == Q5_0 ? 1 : type == Q4_K ? 2 : 3; }

template <bool vnni, typename In>
QRows quantize_any(int type, const In* x, int64_t M, int64_t K) {
  switch (type) {
    case Q8_0: return quantize_rows<Q8_0, vnni ? Tile<Q8_0>::rows : AVX2_ROWS, vnni>(x, M, K);
    case Q5_0: return quantize_rows<Q5_0, vnni ? Tile<Q5_0>::rows : AVX2_ROWS, vnni>(x, M, K);
    case Q4_K: return quantize_rows<Q4_K, vnni ? Tile<Q4_K>::rows : AVX2_ROWS, vnni>(x, M, K);
    default: return quantize_rows<Q6_K, vnni ? Tile<Q6_K>::rows : AVX2_ROWS, vnni>(x, M, K);
  }
}

// Every chunk of rows times tile t of part p.
template <int type, bool vnni, typename Out>
void tile_all_rows(const Part& p, const QRows& r, int64_t t, Out* y, int64_t M, int64_t N, int64_t K) {
  const uint8_t* tile = p.w + t * p.tile_bytes;
  const float* bias = p.bias ? p.bias + t * LANES : nullptr;
  Out* out = y + p.col + t * LANES;
  if constexpr (vnni) {
    for (int64_t m = 0; m < M; m += Tile<type>::rows)
      rows_int8<type, Out>(std::min<int64_t>(Tile<type>::rows, M - m), r, m, tile, bias, out, N, K);
  } else {
    if (M <= avx2_both_halves<type>) return rows_int8_avx2<type, 2, Out>(M, r, 0, tile, 0, bias, out, N, K);
    for (int h = 0; h < 2; h++)
      for (int64_t m = 0; m < M; m += AVX2_ROWS)
        rows_int8_avx2<type, 1, Out>(std::min<int64_t>(AVX2_ROWS, M - m), r, m, tile, h, bias, out, N, K);
  }
}

// x [M, K] fp32 or bf16 times every part -> y [M, N] (N: the parts' outputs side by side). vnni: the AVX512-VNNI
// tiles, else the AVX2 ones (the same bits).
template <bool vnni, typename In, typename Out>
void qgemm_int8(const In* x, const std::vector<Part>& parts, Out* y, int64_t M, int64_t N, int64_t K) {
  QRows rows[4];
  bool rounded[4] = {};
  int64_t tiles = 0, bytes = 0;
  for (const Part& p : parts) {
    const int slot = type_slot(p.type);
    if (!rounded[slot]) rows[slot] = quantize_any<vnni>(p.type, x, M, K), rounded[slot] = true;
    tiles += p.tiles, bytes += p.tiles * p.tile_bytes;
  }
  for_each_row_run(tiles, bytes / std::max<int64_t>(tiles, 1), [&](int64_t first, int64_t last) {
    size_t j = 0;
    int64_t base = 0;  // tiles of the parts before part j
    for (int64_t t = first; t < last; t++) {
      while (t >= base + parts[j].tiles) base += parts[j++].tiles;
      const Part& p = parts[j];
      const QRows& r = rows[type_slot(p.type)];
      switch (p.type) {
        case Q8_0: tile_all_rows<Q8_0, vnni>(p, r, t - base, y, M, N, K); break;
        case Q5_0: tile_all_rows<Q5_0, vnni>(p, r, t - base, y, M, N, K); break;
        case Q4_K: tile_all_rows<Q4_K, vnni>(p, r, t - base, y, M, N, K); break;
        default: tile_all_rows<Q6_K, vnni>(p, r, t - base, y, M, N, K); break;
      }
    }
  }, M > 1 ? MULTI_ROW_RUNS_PER_THREAD : RUNS_PER_THREAD);
}

// Bytes of a tile's block (16 weight rows x one block's weights) in the int8 route's layout.
inline int64_t tile_block_bytes(int type) {
  switch (type) {
    case Q8_0: return Tile<Q8_0>::bytes;
    case Q5_0: return Tile<Q5_0>::bytes;
    case Q4_K: return Tile<Q4_K>::bytes;
    default: return Tile<Q6_K>::bytes;
  }
}

// blocks uint8 [N, row bytes] (N a multiple of 16) -> the int8 route's layout, uint8 [N / 16, tile bytes].
inline void repack_any(int type, const uint8_t* w, int64_t row_bytes, uint8_t* out, int64_t tiles) {
  switch (type) {
    case Q8_0: repack_rows<Q8_0>(w, row_bytes, out, tiles); break;
    case Q5_0: repack_rows<Q5_0>(w, row_bytes, out, tiles); break;
    case Q4_K: repack_rows<Q4_K>(w, row_bytes, out, tiles); break;
    default: repack_rows<Q6_K>(w, row_bytes, out, tiles); break;
  }
}

}  // namespace quant
