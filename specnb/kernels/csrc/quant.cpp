// Few-row linear layers over GGUF's quantized weight blocks (Q8_0, Q5_0, Q4_K, Q6_K), as a PyTorch C++ extension.
//
// A decoding call is bound by reading the weights, and a GGUF file holds them in 4.5-8.5 bits each: streaming
// the blocks as stored reads 2-3.5x fewer bytes than their bf16 dequantization. Each thread takes a run of
// weight rows; a weight row is decoded once per call into an fp32 buffer in L1/L2 (the same fp32 operations
// as the `gguf` package's dequantization, so the same values), then every input row is multiplied with it.
//
// Rows are bit-independent: each output element is the same instruction sequence whatever the number of rows
// and wherever its row sits (a fixed accumulation over K in order, one fixed reduction, bias added in fp32, one
// rounding to the output dtype), so a verified draft gets the bits of decoding its tokens alone. Activations
// are never quantized.
//
// Paths (the caller picks one from the CPU flags, as for fewrow.cpp):
//   ISA_AVX2        every x86 class: weights decoded to fp32 (d * q), fp32 FMAs with fp32 activations
//                   (bf16 ones widened exactly); four 8-lane accumulators per row.
//   ISA_AVX512BF16  bf16 activations: each group of 32 weights is kept as its small integers q, exact in bf16,
//                   so vdpbf16ps forms x * q exactly and sums pairs in fp32; the group's scale multiplies that
//                   partial sum (16 lanes, one scale per 16 weights) and Q4_K's offset subtracts min * sum(x).
//                   sum_k x_k (d q_k - m) = d sum_k x_k q_k - m sum_k x_k: the same weights, another fixed order.
// Threads: ATen's intra-op pool (at::parallel_for), the one torch.set_num_threads controls.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// ggml's type ids (gguf.GGMLQuantizationType)
constexpr int Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14;
constexpr int ISA_AVX2 = 0, ISA_AVX512BF16 = 1;  // as in fewrow.cpp and specnb.kernels.cpu.ISAS
constexpr int MB = 3;  // input rows per pass over a decoded weight row: 3 x 4 ymm accumulators (AVX2 path)
constexpr int MB_BF16 = 4;  // the same on the AVX512-BF16 path: 4 zmm accumulators
using bf16 = uint16_t;

struct Format {
  int64_t weights;  // per block
  int64_t bytes;    // per block
};

Format format(int type) {
  switch (type) {
    case Q8_0: return {32, 34};   // fp16 d, int8 q[32]: w = d * q
    case Q5_0: return {32, 22};   // fp16 d, uint32 high bits, 16 bytes of low nibbles: w = d * (q - 16)
    case Q4_K: return {256, 144}; // fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    case Q6_K: return {256, 210}; // 128 bytes low nibbles, 64 bytes high 2-bit pairs, int8 scales[16], fp16 d
    default: TORCH_CHECK(false, "quant: unsupported ggml type ", type);
  }
}

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// bit j of x -> byte j of the result: 0xff where set, 0 where not
inline __m256i bits_to_bytes(uint32_t x) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(x)), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // byte i: every bit but bit i
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

// One block as groups of 32 weights: q (small integers), the scale of weights 0-15 and of 16-31, the offset.
struct Groups {
  alignas(32) int8_t q[256];
  float lo[8], hi[8], offset[8];
};

inline void store32(int8_t* out, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(out), v); }

// Returns the number of groups in the block (1 or 8). The scales are the gguf package's fp32 products.
int block_groups(int type, const uint8_t* p, Groups& g) {
  switch (type) {
    case Q8_0: {
      store32(g.q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)));
      g.lo[0] = g.hi[0] = half(p);
      g.offset[0] = 0.0f;
      return 1;
    }
    case Q5_0: {
      uint32_t high;
      std::memcpy(&high, p + 2, 4);
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
      const __m128i nibble = _mm_set1_epi8(0x0f);
      __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), nibble), _mm_and_si128(qs, nibble));
      q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(high), _mm256_set1_epi8(0x10)));
      store32(g.q, _mm256_sub_epi8(q, _mm256_set1_epi8(16)));
      g.lo[0] = g.hi[0] = half(p);
      g.offset[0] = 0.0f;
      return 1;
    }
    case Q4_K: {
      const float d = half(p), dmin = half(p + 2);
      const uint8_t* s = p + 4;
      for (int j = 0; j < 8; j++) {
        const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (j / 2)));
        store32(g.q + 32 * j, _mm256_and_si256(_mm256_srli_epi16(raw, 4 * (j % 2)), _mm256_set1_epi8(0x0f)));
        g.lo[j] = g.hi[j] = d * float(sc);
        g.offset[j] = dmin * float(m);
      }
      return 8;
    }
    default: {  // Q6_K
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
      const float d = half(p + 208);
      const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
      for (int h = 0; h < 2; h++) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(hi, 4), high2)),
            _mm256_or_si256(_mm256_and_si256(b, low4), _mm256_and_si256(_mm256_slli_epi16(hi, 2), high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hi, high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(hi, 2), high2))};
        for (int j = 0; j < 4; j++) {
          store32(g.q + 32 * (4 * h + j), _mm256_sub_epi8(q[j], bias));
          g.lo[4 * h + j] = d * float(scales[8 * h + 2 * j]);
          g.hi[4 * h + j] = d * float(scales[8 * h + 2 * j + 1]);
          g.offset[4 * h + j] = 0.0f;
        }
      }
      return 8;
    }
  }
}

// One weight row as fp32 weights for the AVX2 path: scale * q - offset per group (the gguf package's products
// and, for Q4_K, its subtraction; the other formats subtract an exact 0).
void decode_row(int type, const uint8_t* row, int64_t K, float* out) {
  const Format f = format(type);
  Groups g;
  for (int64_t b = 0; b < K / f.weights; b++) {
    const int n = block_groups(type, row + b * f.bytes, g);
    for (int i = 0; i < n; i++) {
      float* o = out + b * f.weights + 32 * i;
      const __m256 offset = _mm256_set1_ps(g.offset[i]);
      for (int c = 0; c < 32; c += 8) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(g.q + 32 * i + c))));
        _mm256_storeu_ps(o + c, _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(c < 16 ? g.lo[i] : g.hi[i]), q), offset));
      }
    }
  }
}

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline void store(float* y, float v) { *y = v; }
inline void store(at::BFloat16* y, float v) { *y = at::BFloat16(v); }  // round to nearest even

// y[m, 0] for m < mb: x rows [mb, K] (stride K) times the decoded weight row w [K]. Per element: four 8-lane
// accumulators over K in steps of 32, reduced as (a0 + a1) + (a2 + a3), then hsum256: fixed for every mb.
template <int mb, typename Out>
void dot_rows(const float* x, const float* w, float bias, Out* y, int64_t ldy, int64_t K) {
  __m256 acc[mb][4];
  for (int m = 0; m < mb; m++)
    for (int a = 0; a < 4; a++) acc[m][a] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    const __m256 w2 = _mm256_loadu_ps(w + k + 16), w3 = _mm256_loadu_ps(w + k + 24);
    for (int m = 0; m < mb; m++) {
      const float* xm = x + m * K + k;
      acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xm), w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 8), w1, acc[m][1]);
      acc[m][2] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 16), w2, acc[m][2]);
      acc[m][3] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 24), w3, acc[m][3]);
    }
  }
  for (int m = 0; m < mb; m++) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[m][0], acc[m][1]), _mm256_add_ps(acc[m][2], acc[m][3]));
    store(y + m * ldy, hsum256(s) + bias);
  }
}

// Weight rows are handed out in runs from a shared counter (a busy core's share goes to the others), each run
// long enough to be one sequential stream for the hardware prefetchers; body(first, last) does rows [first, last).
template <typename Body>
void for_each_row_run(int64_t N, int64_t row_bytes, const Body& body) {
  constexpr int64_t MIN_RUN_BYTES = 64 << 10, RUNS_PER_THREAD = 4;
  const int64_t threads = at::get_num_threads();
  int64_t runs = std::min(N * row_bytes / MIN_RUN_BYTES, RUNS_PER_THREAD * threads);
  runs = std::max<int64_t>(1, std::min(runs, N));
  const int64_t run = (N + runs - 1) / runs;
  runs = (N + run - 1) / run;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(runs, threads), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++)
      for (int64_t first; (first = next.fetch_add(run)) < N;) body(first, std::min(first + run, N));
  });
}

template <typename Out>
void qgemm(int type, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
           int64_t N, int64_t K) {
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    std::vector<float> decoded(K);
    for (int64_t n = first; n < last; n++) {
      decode_row(type, w + n * row_bytes, K, decoded.data());
      const float b = bias ? bias[n] : 0.0f;
      int64_t m = 0;
      for (; m + MB <= M; m += MB) dot_rows<MB>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
      if (M - m == 2) dot_rows<2>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
      if (M - m == 1) dot_rows<1>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
    }
  });
}

// ------------------------------------------------------------------------------------ AVX512-BF16

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c")))

// A weight row decoded for the AVX512-BF16 path: per group g of 32 weights, q as bf16 at q + 32 g, a 16-lane
// scale vector at scale + 16 g (lanes 0-7: weights 0-15, lanes 8-15: weights 16-31), the offset at offset[g].
AVX512BF16 void decode_row_bf16(int type, const uint8_t* row, int64_t K, bf16* q, float* scale, float* offset) {
  const Format f = format(type);
  Groups g;
  int64_t group = 0;
  for (int64_t b = 0; b < K / f.weights; b++) {
    const int n = block_groups(type, row + b * f.bytes, g);
    for (int i = 0; i < n; i++, group++) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.q + 32 * i));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
      _mm512_storeu_si512(q + 32 * group, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));  // small integers: exact
      _mm512_storeu_ps(scale + 16 * group, _mm512_insertf32x8(_mm512_set1_ps(g.lo[i]), _mm256_set1_ps(g.hi[i]), 1));
      offset[group] = g.offset[i];
    }
  }
}

// y[m, 0] for m < mb: bf16 rows x [mb, K] times the decoded row. Per element, for each group in order:
// acc = scale * dpbf16(0, x, q) + acc, then acc = acc - offset * xsum (rows' 16-lane partial sums of x over
// the group, Q4_K only); one _mm512_reduce_add_ps, bias, one rounding.
template <int mb, bool offsets, typename Out>
AVX512BF16 void dot_rows_bf16(const bf16* x, const float* xsum, const bf16* q, const float* scale,
                              const float* offset, float bias, Out* y, int64_t ldy, int64_t K) {
  const int64_t G = K / 32;
  __m512 acc[mb];
  for (int m = 0; m < mb; m++) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; g++) {
    const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + 32 * g);
    const __m512 sv = _mm512_loadu_ps(scale + 16 * g);
    for (int m = 0; m < mb; m++) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + 32 * g);
      acc[m] = _mm512_fmadd_ps(sv, _mm512_dpbf16_ps(_mm512_setzero_ps(), xv, qv), acc[m]);
      if constexpr (offsets)
        acc[m] = _mm512_fnmadd_ps(_mm512_set1_ps(offset[g]), _mm512_loadu_ps(xsum + 16 * (m * G + g)), acc[m]);
    }
  }
  for (int m = 0; m < mb; m++) store(y + m * ldy, _mm512_reduce_add_ps(acc[m]) + bias);
}

template <bool offsets, typename Out>
AVX512BF16 void rows_bf16(const bf16* x, const float* xsum, const bf16* q, const float* scale, const float* offset,
                          float bias, Out* y, int64_t N, int64_t M, int64_t K) {
  const int64_t G = K / 32;
  auto sums = [&](int64_t m) { return xsum ? xsum + 16 * m * G : nullptr; };
  int64_t m = 0;
  for (; m + MB_BF16 <= M; m += MB_BF16)
    dot_rows_bf16<MB_BF16, offsets>(x + m * K, sums(m), q, scale, offset, bias, y + m * N, N, K);
  const int rest = int(M - m);
  const float* xs = sums(m);
  if (rest == 3) dot_rows_bf16<3, offsets>(x + m * K, xs, q, scale, offset, bias, y + m * N, N, K);
  if (rest == 2) dot_rows_bf16<2, offsets>(x + m * K, xs, q, scale, offset, bias, y + m * N, N, K);
  if (rest == 1) dot_rows_bf16<1, offsets>(x + m * K, xs, q, scale, offset, bias, y + m * N, N, K);
}

// 16-lane partial sums of each row of x over each group of 32: float [M, K / 32, 16] (Q4_K's offsets multiply
// them). Floats, loaded unaligned: a vector of __m512 need not be 64-byte aligned.
AVX512BF16 std::vector<float> group_sums(const bf16* x, int64_t M, int64_t K) {
  const int64_t G = K / 32;
  std::vector<float> out(M * G * 16);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < G; g++)
      _mm512_storeu_ps(out.data() + 16 * (m * G + g),
                       _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(x + m * K + 32 * g), ones));
  return out;
}

AVX512BF16 void qgemm_bf16(int type, const bf16* x, const uint8_t* w, int64_t row_bytes, const float* bias,
                           at::BFloat16* y, int64_t M, int64_t N, int64_t K) {
  const std::vector<float> xsum = type == Q4_K ? group_sums(x, M, K) : std::vector<float>();
  for_each_row_run(N, row_bytes, [&](int64_t first, int64_t last) {
    std::vector<bf16> q(K);
    std::vector<float> scale(K / 2), offset(K / 32);
    for (int64_t n = first; n < last; n++) {
      decode_row_bf16(type, w + n * row_bytes, K, q.data(), scale.data(), offset.data());
      const float b = bias ? bias[n] : 0.0f;
      if (type == Q4_K)
        rows_bf16<true>(x, xsum.data(), q.data(), scale.data(), offset.data(), b, y + n, N, M, K);
      else
        rows_bf16<false>(x, nullptr, q.data(), scale.data(), offset.data(), b, y + n, N, M, K);
    }
  });
}

}  // namespace

// x [M, K] float32 or bfloat16 (contiguous), blocks uint8 [N, K / block * bytes] of ggml type `type`, bias [N]
// or None. Returns [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t type,
                     const c10::optional<torch::Tensor>& bias, int64_t isa) {
  const Format f = format(int(type));
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8, "quant.linear: shapes");
  const int64_t M = x.size(0), N = blocks.size(0), K = x.size(1);
  TORCH_CHECK(K % f.weights == 0 && blocks.size(1) == K / f.weights * f.bytes,
              "quant.linear: x has ", K, " columns, the blocks hold rows of ", blocks.size(1), " bytes");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "quant.linear: x must be float32 or bfloat16");
  const auto w = blocks.contiguous();
  torch::Tensor bias32;
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    bias32 = bias->to(torch::kFloat32).contiguous();
    b = bias32.data_ptr<float>();
  }
  auto out = torch::empty({M, N}, x.options());
  if (isa == ISA_AVX512BF16 && x.scalar_type() == torch::kBFloat16) {
    const auto xc = x.contiguous();
    qgemm_bf16(int(type), reinterpret_cast<const bf16*>(xc.data_ptr()), w.data_ptr<uint8_t>(), w.size(1), b,
               out.data_ptr<at::BFloat16>(), M, N, K);
    return out;
  }
  const auto x32 = x.to(torch::kFloat32).contiguous();  // exact for bf16
  if (x.scalar_type() == torch::kFloat32) {
    qgemm<float>(int(type), x32.data_ptr<float>(), w.data_ptr<uint8_t>(), w.size(1), b, out.data_ptr<float>(), M, N,
                 K);
  } else {
    qgemm<at::BFloat16>(int(type), x32.data_ptr<float>(), w.data_ptr<uint8_t>(), w.size(1), b,
                        out.data_ptr<at::BFloat16>(), M, N, K);
  }
  return out;
}

// blocks uint8 [N, row bytes] -> float32 [N, K]: the weights each call decodes (for tests and inspection).
torch::Tensor dequantize(const torch::Tensor& blocks, int64_t type) {
  const Format f = format(int(type));
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8 && blocks.size(1) % f.bytes == 0,
              "quant.dequantize: uint8 [N, row bytes]");
  const auto w = blocks.contiguous();
  const int64_t N = w.size(0), K = w.size(1) / f.bytes * f.weights;
  auto out = torch::empty({N, K}, torch::kFloat32);
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++)
      decode_row(int(type), w.data_ptr<uint8_t>() + n * w.size(1), K, out.data_ptr<float>() + n * K);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("linear", &linear, "few-row linear layer over GGUF blocks, rows bit-independent");
  module.def("dequantize", &dequantize, "GGUF blocks to float32 rows, as the linear layer decodes them");
}
