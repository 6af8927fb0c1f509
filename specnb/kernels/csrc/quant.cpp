// Few-row linear layers over GGUF's quantized weight blocks (Q8_0, Q5_0, Q4_K, Q6_K), as a PyTorch C++ extension.
//
// A decoding call is bound by reading the weights, and a GGUF file holds them in 4.5-8.5 bits each: streaming
// the blocks as stored reads 2-3.5x fewer bytes than their bf16 dequantization. Each thread takes a run of
// weight rows; a weight row is decoded once per call into an fp32 buffer in L1/L2 (the same fp32 operations
// as the `gguf` package's dequantization, so the same values), then every input row is multiplied with it.
//
// Rows are bit-independent: each output element is the same instruction sequence whatever the number of rows
// and wherever its row sits (four 8-lane fp32 accumulators over K in order, one fixed reduction, bias added
// in fp32, one rounding to the output dtype), so a verified draft gets the bits of decoding its tokens alone.
// Activations stay fp32 (bf16 inputs are widened exactly): no activation quantization.
//
// Path: AVX2 + FMA + F16C (every x86 class specnb supports).
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
constexpr int MB = 3;  // input rows per pass over a decoded weight row: 3 x 4 ymm accumulators

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

// 32 int8 in v -> out[0..32) as fp32 times scale (one rounding per weight, as d * q in fp32)
inline void scale32(__m256i v, __m256 scale, float* out) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  _mm256_storeu_ps(out + 0, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
  _mm256_storeu_ps(out + 16, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
  _mm256_storeu_ps(out + 24, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

// 8 unsigned bytes at p -> fp32: scale * q - offset (two roundings, as the gguf package's d * q - dm)
inline __m256 affine8(__m128i q8, __m256 scale, __m256 offset) {
  return _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8))), offset);
}

// bit j of x -> byte j of the result: 0xff where set, 0 where not
inline __m256i bits_to_bytes(uint32_t x) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(x)), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // byte i: every bit but bit i
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

void decode_q8_0(const uint8_t* p, float* out) {
  scale32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)), _mm256_set1_ps(half(p)), out);
}

void decode_q5_0(const uint8_t* p, float* out) {
  uint32_t high;
  std::memcpy(&high, p + 2, 4);
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), nibble), _mm_and_si128(qs, nibble));
  q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(high), _mm256_set1_epi8(0x10)));
  scale32(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), _mm256_set1_ps(half(p)), out);
}

void decode_q4_k(const uint8_t* p, float* out) {
  const float d = half(p), dmin = half(p + 2);
  const uint8_t* s = p + 4;
  const uint8_t* q = p + 16;
  for (int j = 0; j < 8; j++) {  // 8 sub-blocks of 32: 6-bit scale and min each
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    const __m256 scale = _mm256_set1_ps(d * float(sc)), offset = _mm256_set1_ps(dmin * float(m));
    const uint8_t* bytes = q + 32 * (j / 2);  // sub-block 2i: low nibbles of bytes 32i.., 2i + 1: high ones
    const int shift = 4 * (j % 2);
    for (int c = 0; c < 32; c += 16) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + c));
      const __m128i v = _mm_and_si128(_mm_srli_epi16(raw, shift), _mm_set1_epi8(0x0f));
      _mm256_storeu_ps(out + 32 * j + c, affine8(v, scale, offset));
      _mm256_storeu_ps(out + 32 * j + c + 8, affine8(_mm_srli_si128(v, 8), scale, offset));
    }
  }
}

void decode_q6_k(const uint8_t* p, float* out) {
  const uint8_t* ql = p;
  const uint8_t* qh = p + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
  const float d = half(p + 208);
  const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
  for (int h = 0; h < 2; h++) {  // two halves of 128 weights: 64 bytes of ql, 32 of qh each
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    const __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(hi, 4), high2)),
        _mm256_or_si256(_mm256_and_si256(b, low4), _mm256_and_si256(_mm256_slli_epi16(hi, 2), high2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hi, high2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4),
                        _mm256_and_si256(_mm256_srli_epi16(hi, 2), high2))};
    for (int g = 0; g < 4; g++) {  // 32 weights, two scales of 16
      alignas(32) int8_t v[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_sub_epi8(q[g], bias));
      float* o = out + 128 * h + 32 * g;
      for (int half16 = 0; half16 < 2; half16++) {
        const __m256 scale = _mm256_set1_ps(d * float(scales[8 * h + 2 * g + half16]));
        for (int c = 0; c < 16; c += 8) {
          const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + 16 * half16 + c));
          _mm256_storeu_ps(o + 16 * half16 + c, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
        }
      }
    }
  }
}

void decode_row(int type, const uint8_t* row, int64_t K, float* out) {
  const Format f = format(type);
  for (int64_t b = 0; b < K / f.weights; b++) {
    const uint8_t* p = row + b * f.bytes;
    float* o = out + b * f.weights;
    switch (type) {
      case Q8_0: decode_q8_0(p, o); break;
      case Q5_0: decode_q5_0(p, o); break;
      case Q4_K: decode_q4_k(p, o); break;
      default: decode_q6_k(p, o); break;
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
// long enough to be one sequential stream for the hardware prefetchers.
template <typename Out>
void qgemm(int type, const float* x, const uint8_t* w, int64_t row_bytes, const float* bias, Out* y, int64_t M,
           int64_t N, int64_t K) {
  constexpr int64_t MIN_RUN_BYTES = 64 << 10, RUNS_PER_THREAD = 4;
  const int64_t threads = at::get_num_threads();
  int64_t runs = std::min(N * row_bytes / MIN_RUN_BYTES, RUNS_PER_THREAD * threads);
  runs = std::max<int64_t>(1, std::min(runs, N));
  const int64_t run = (N + runs - 1) / runs;
  runs = (N + run - 1) / run;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(runs, threads), 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> decoded(K);
    for (int64_t t = t0; t < t1; t++) {
      for (int64_t first; (first = next.fetch_add(run)) < N;) {
        for (int64_t n = first; n < std::min(first + run, N); n++) {
          decode_row(type, w + n * row_bytes, K, decoded.data());
          const float b = bias ? bias[n] : 0.0f;
          int64_t m = 0;
          for (; m + MB <= M; m += MB) dot_rows<MB>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
          if (M - m == 2) dot_rows<2>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
          if (M - m == 1) dot_rows<1>(x + m * K, decoded.data(), b, y + m * N + n, N, K);
        }
      }
    }
  });
}

}  // namespace

// x [M, K] float32 or bfloat16 (contiguous), blocks uint8 [N, K / block * bytes] of ggml type `type`, bias [N]
// or None. Returns [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t type,
                     const c10::optional<torch::Tensor>& bias) {
  const Format f = format(int(type));
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8, "quant.linear: shapes");
  const int64_t M = x.size(0), N = blocks.size(0), K = x.size(1);
  TORCH_CHECK(K % f.weights == 0 && blocks.size(1) == K / f.weights * f.bytes,
              "quant.linear: x has ", K, " columns, the blocks hold rows of ", blocks.size(1), " bytes");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "quant.linear: x must be float32 or bfloat16");
  const auto x32 = x.to(torch::kFloat32).contiguous();  // exact for bf16
  const auto w = blocks.contiguous();
  torch::Tensor bias32;
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    bias32 = bias->to(torch::kFloat32).contiguous();
    b = bias32.data_ptr<float>();
  }
  auto out = torch::empty({M, N}, x.options());
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
