// attention(): exact attention for decoding and verification calls.
//
// Per (batch, KV head): the scores of every query row of the group (G heads x Q queries) against every key
// are one call of the few-row GEMM (gemm.h; per-element sequence fixed, whatever the numbers of rows and
// keys); each row's softmax runs over the keys in cache order, a blocked key contributing exactly 0; and
// out[r, d] = sum over keys, in cache order, of p[r, j] * v[j, d], one fused multiply-add per key. Adding
// exact zeros changes no bits, so a query next to others and with extra masked keys gets the bits it gets
// alone with only its visible keys: what makes tree verification exact.

#include "fewrow.h"
#include "gemm.h"

namespace {

constexpr int PV_ROWS = 4;    // query rows sharing each loaded value vector
constexpr int PV_CHUNK = 16;  // output elements per task (two ymm accumulators per row)
// The AVX512 form: 8 rows x 32 elements per task in zmm registers, each value vector loaded once for 8 rows.
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
  // other threads costs, so small ones run inline.
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
