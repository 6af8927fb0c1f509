// Helpers every CPU kernel of the extension shares: the ISA paths' numbers, bf16 <-> fp32 and rounding stores.
//
// Paths (the caller picks one from the CPU flags, specnb/model/kernels/cpu.py; numbered as its ISAS):
//   ISA_AVX2        fp32 FMA over ymm; bf16 values widened to fp32 in registers (every x86 class)
//   ISA_AVX512BF16  AVX512 classes: bf16 x bf16 -> fp32 dot products (vdpbf16ps) and 512-bit fp32 FMAs
//   ISA_INT8        GGUF blocks times int8-rounded activations (quant_int8.h) with AVX512-VNNI
//   ISA_INT8_AVX2   the same route and bits on AVX2 (vpmaddubsw)
// Threads: ATen's intra-op pool (at::parallel_for), the one torch.set_num_threads controls.

#pragma once

#include <torch/types.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

constexpr int ISA_AVX2 = 0;
constexpr int ISA_AVX512BF16 = 1;
constexpr int ISA_INT8 = 2;
constexpr int ISA_INT8_AVX2 = 3;

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

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

// Eight fp32 values rounded as at::BFloat16 rounds each (to the nearest bf16, ties to even, every NaN to 0x7fc0),
// kept as fp32; round8(v, float{}) leaves them as they are.
inline __m256 round8(__m256 v, float) { return v; }
inline __m256 round8(__m256 v, bf16) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i half = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                        _mm256_set1_epi32(0x7fff));
  __m256i r = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_add_epi32(u, half), 16), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm256_castsi256_ps(r);
}

// Eight values stored as eight calls of store() store them.
inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline void store8(at::BFloat16* y, __m256 v) {
  const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(round8(v, bf16{})), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y),
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

template <typename W>
inline __m256 load8(const W* p);
template <>
inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
inline __m256 load8<bf16>(const bf16* p) { return widen8(p); }

inline float scalar(float v) { return v; }
inline float scalar(bf16 v) { return widen1(v); }
