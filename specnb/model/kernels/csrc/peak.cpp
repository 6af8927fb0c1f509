// peak_rate(): the multiply-adds per second one instruction reaches on this machine's threads, from registers
// alone (no memory), so every kernel's timing can be stated as a fraction of the roof of the instructions its path
// uses: fp32 FMAs (the exact block path and the AVX2 path), vdpbf16ps (the bf16 kernel), vpdpbusd (the int8 route),
// vpmaddubsw + vpmaddwd + vpaddd (the int8 route on AVX2).

#include "fewrow.h"

#include <chrono>

namespace {

constexpr int CHAINS = 12;  // independent accumulators: enough to cover every instruction's latency

alignas(64) volatile char sink_bytes[64];
void* const sink = const_cast<char*>(sink_bytes);

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// n iterations of CHAINS independent `instruction`s (each `macs` multiply-adds) on accumulators of type V, from
// registers; returns multiply-adds per second. Every chain's last value is written out, so none is dropped.
#define PEAK_LOOP(V, init, instruction, macs)                                   \
  V acc[CHAINS];                                                                \
  for (int j = 0; j < CHAINS; j++) acc[j] = init;                               \
  const auto start = std::chrono::steady_clock::now();                          \
  for (int64_t i = 0; i < n; i++) {                                             \
    _Pragma("GCC unroll 12") for (int j = 0; j < CHAINS; j++) acc[j] = instruction; \
  }                                                                             \
  const double seconds = since(start);                                          \
  for (int j = 0; j < CHAINS; j++) std::memcpy(sink, &acc[j], sizeof(V));      \
  return double(n) * CHAINS * (macs) / seconds;

__attribute__((target("avx2,fma"))) double fma256(int64_t n) {
  const __m256 w = _mm256_set1_ps(0.999f);
  PEAK_LOOP(__m256, _mm256_set1_ps(1.0f), _mm256_fmadd_ps(acc[j], w, w), 8)
}

__attribute__((target("avx512f"))) double fma512(int64_t n) {
  const __m512 w = _mm512_set1_ps(0.999f);
  PEAK_LOOP(__m512, _mm512_set1_ps(1.0f), _mm512_fmadd_ps(acc[j], w, w), 16)
}

AVX512BF16 double bf16dot(int64_t n) {
  const __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80);
  PEAK_LOOP(__m512, _mm512_set1_ps(1.0f), _mm512_dpbf16_ps(acc[j], w, w), 32)
}

__attribute__((target("avx512f,avx512vnni"))) double vnni(int64_t n) {
  const __m512i w = _mm512_set1_epi8(3);
  PEAK_LOOP(__m512i, _mm512_set1_epi32(1), _mm512_dpbusd_epi32(acc[j], w, w), 64)
}

#undef PEAK_LOOP

// vpdpbusd in the form the int8 tiles issue it (quant_int8.h): 16 accumulators, 8 weight registers, the other
// operand 4 bytes broadcast from memory (L1) folded into the instruction; the register form above runs faster than
// a product of two matrices can, since one of them must be broadcast a row at a time.
__attribute__((target("avx512f,avx512vnni"))) double vnni_broadcast(int64_t n) {
  constexpr int ROWS = 16, STEPS = 8;
  alignas(64) static int32_t q[STEPS * ROWS];
  for (int i = 0; i < STEPS * ROWS; i++) q[i] = 0x01010101 * (i % 7);
  __m512i w[STEPS], acc[ROWS];
  for (int s = 0; s < STEPS; s++) w[s] = _mm512_set1_epi8(char(3 + s));
  for (int m = 0; m < ROWS; m++) acc[m] = _mm512_set1_epi32(m);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += STEPS) {
#pragma GCC unroll 8
    for (int s = 0; s < STEPS; s++)
#pragma GCC unroll 16
      for (int m = 0; m < ROWS; m++) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc[m]) : "v"(w[s]), "m"(q[s * ROWS + m]));
  }
  const double seconds = since(start);
  for (int m = 0; m < ROWS; m++) std::memcpy(sink, &acc[m], sizeof(__m512i));
  return double((n + STEPS - 1) / STEPS * STEPS) * ROWS * 64 / seconds;
}

// The int8 route's step on AVX2 as its half tiles issue it (quant_int8.h's dots8): a row's 4 bytes broadcast from L1,
// times a register of unsigned codes (vpmaddubsw), pairs summed in int32 (vpmaddwd), accumulated (vpaddd): 32
// multiply-adds a row and step, 4 rows, 8 code registers.
__attribute__((target("avx2"))) double maddubs_broadcast(int64_t n) {
  constexpr int ROWS = 4, STEPS = 8;
  alignas(64) static int32_t q[STEPS * ROWS];
  for (int i = 0; i < STEPS * ROWS; i++) q[i] = 0x01010101 * (i % 7);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i w[STEPS], acc[ROWS];
  for (int s = 0; s < STEPS; s++) w[s] = _mm256_set1_epi8(char(3 + s));
  for (int m = 0; m < ROWS; m++) acc[m] = _mm256_set1_epi32(m);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += STEPS) {
#pragma GCC unroll 8
    for (int s = 0; s < STEPS; s++) {
      __m256i codes = w[s];
      __asm__ volatile("" : "+x"(codes));  // opaque: the products cannot be hoisted out of the loop
#pragma GCC unroll 4
      for (int m = 0; m < ROWS; m++)
        acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(_mm256_maddubs_epi16(codes, _mm256_set1_epi32(q[s * ROWS + m])), ones));
    }
  }
  const double seconds = since(start);
  for (int m = 0; m < ROWS; m++) std::memcpy(sink, &acc[m], sizeof(__m256i));
  return double((n + STEPS - 1) / STEPS * STEPS) * ROWS * 32 / seconds;
}

}  // namespace

// kind 0: fp32 FMA (zmm where avx512 is true, else ymm), 1: vdpbf16ps, 2: vpdpbusd, 3: vpdpbusd with a broadcast
// memory operand (vnni_broadcast), 4: vpmaddubsw + vpmaddwd + vpaddd on a broadcast
// (maddubs_broadcast); every thread of ATen's pool
// runs the loop at once for about `seconds`. Returns multiply-adds per second, all threads together.
double peak_rate(int64_t kind, bool avx512, double seconds) {
  const auto run = [&](int64_t n) {
    return kind == 4 ? maddubs_broadcast(n) : kind == 3 ? vnni_broadcast(n) : kind == 2 ? vnni(n) : kind == 1 ? bf16dot(n)
           : avx512 ? fma512(n) : fma256(n);
  };
  const double probe = run(100000);  // per thread, to size the timed loop
  const int64_t n = std::max<int64_t>(1000, int64_t(seconds * probe / (CHAINS * 16)));
  const int64_t threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) rates[t] = run(n);
  });
  double total = 0.0;
  for (double r : rates) total += r;
  return total;
}
