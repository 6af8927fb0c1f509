// attention(): exact attention for decoding and verification calls, and for prefills.
//
// Per (batch, KV head): the scores of the group's query rows (G heads x Q queries), ROW_CHUNK rows at a time,
// against the keys from the first to the last any of them sees are one call of the few-row GEMM (gemm.h; per-element
// sequence fixed, whatever the numbers of rows and keys); each row's softmax runs over the keys in cache order,
// a blocked key contributing exactly 0; and out[r, d] = sum over keys, in cache order, of p[r, j] * v[j, d], one
// fused multiply-add per key. Adding exact zeros changes no bits, so a query next to others and with extra
// masked keys gets the bits it gets alone with only its visible keys: what makes tree verification exact.

#include "fewrow.h"
#include "gemm.h"

#include <memory>

namespace {

constexpr int PV_ROWS = 4;    // query rows sharing each loaded value vector
constexpr int PV_CHUNK = 16;  // output elements per task (two ymm accumulators per row)
// The AVX512 form: 8 rows x 32 elements per task in zmm registers, each value vector loaded once for 8 rows.
constexpr int PV_ROWS_512 = 8, PV_CHUNK_512 = 32;
constexpr int64_t PARALLEL_WORK = int64_t(1) << 20;  // multiply-adds per KV head (R * S * D) worth a fork per step
// keys x head dim (S * D) above which a call of fewer rows than a value block per thread splits each step too:
// threads that split the rows would each read every key and value, and those reads cost more than the forks
constexpr int64_t SHARED_KV = int64_t(1) << 15;
constexpr int64_t PV_PREFETCH = 16;  // value rows ahead a value product asks for (its loads are strided)
constexpr int64_t ROW_CHUNK = 128;  // query rows (heads x queries) scored at once

// exp of 8 floats with the bits of glibc's expf (2.27 and later, its FMA variant, which std::exp calls on every
// x86 class specnb builds for): the same double-precision steps, fused where it fuses them, with its 32-entry table
// of 2^(i/32). Lanes with |x| >= 88 or NaN (overflow, underflow, the special values) take std::exp itself, but
// those set in `skip` (their result unused).
constexpr uint64_t EXP2_TABLE[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

inline double bits_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

inline __m128 exp4(__m128 x) {
  const __m256d inv_ln2_n = _mm256_set1_pd(bits_double(0x40471547652b82fe));  // 32 / ln 2
  const __m256d shift = _mm256_set1_pd(bits_double(0x4338000000000000));      // 0x1.8p52
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d kd_shifted = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kd_shifted);
  const __m256d kd = _mm256_sub_pd(kd_shifted, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
  const __m256i t = _mm256_add_epi64(
      _mm256_i64gather_epi64(reinterpret_cast<const long long*>(EXP2_TABLE), _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
      _mm256_slli_epi64(ki, 47));
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(bits_double(0x3ebc6af84b912394)),
                                    _mm256_set1_pd(bits_double(0x3f2ebfce50fac4f3)));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(bits_double(0x3f962e42ff0c52d6)), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

inline __m256 exp8(__m256 x, int skip) {
  __m256 y = _mm256_set_m128(exp4(_mm256_extractf128_ps(x, 1)), exp4(_mm256_castps256_ps128(x)));
  const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
  const int special =
      _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a)))) & ~skip;
  if (special) {
    alignas(32) float xs[8], ys[8];
    _mm256_store_ps(xs, x);
    _mm256_store_ps(ys, y);
    for (int k = 0; k < 8; k++)
      if (special >> k & 1) ys[k] = std::exp(xs[k]);
    y = _mm256_load_ps(ys);
  }
  return y;
}

// One row of scores [S] -> its softmax weights before the division: each key after `last` (causal) or blocked by
// the mask row (a value below -1e30; mask stride ms) weighs exactly 0, the others exp(s - max) of the scaled
// (softcapped, masked) score s; in the order and with the bits of one scalar pass over the keys.
inline void weights_row(float* row, int64_t S, int64_t last, const float* mrow, int64_t ms, float scale,
                        float softcap) {
  const float inf = std::numeric_limits<float>::infinity();
  float best = -inf;
  int64_t j = 0;
  if (softcap == 0.0f && (!mrow || ms == 1)) {
    __m256 top = _mm256_set1_ps(-inf);
    for (; j + 8 <= S; j += 8) {
      __m256 s = _mm256_mul_ps(_mm256_loadu_ps(row + j), _mm256_set1_ps(scale));
      __m256 hidden;
      if (mrow) {
        const __m256 m = _mm256_loadu_ps(mrow + j);
        hidden = _mm256_cmp_ps(m, _mm256_set1_ps(-1e30f), _CMP_NGT_UQ);
        s = _mm256_add_ps(s, m);
      } else {
        const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(int(j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(int(last))));
      }
      s = _mm256_blendv_ps(s, _mm256_set1_ps(-inf), hidden);
      _mm256_storeu_ps(row + j, s);
      top = _mm256_max_ps(s, top);
    }
    alignas(32) float tops[8];
    _mm256_store_ps(tops, top);
    for (int k = 0; k < 8; k++) best = std::max(best, tops[k]);
  }
  for (; j < S; j++) {
    const bool visible = mrow ? mrow[j * ms] > -1e30f : j <= last;
    float s = -inf;
    if (visible) {
      s = row[j] * scale;
      if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;
      if (mrow) s += mrow[j * ms];
    }
    row[j] = s;
    best = std::max(best, s);
  }
  j = 0;
  for (; j + 8 <= S; j += 8) {
    const __m256 s = _mm256_loadu_ps(row + j), blocked = _mm256_cmp_ps(s, _mm256_set1_ps(-inf), _CMP_EQ_OQ);
    const __m256 e = exp8(_mm256_sub_ps(s, _mm256_set1_ps(best)), _mm256_movemask_ps(blocked));
    _mm256_storeu_ps(row + j, _mm256_blendv_ps(e, _mm256_setzero_ps(), blocked));
  }
  for (; j < S; j++) row[j] = row[j] == -inf ? 0.0f : std::exp(row[j] - best);
}

// totals[r] = the sum of row r's weights in key order, for rows r0..r1-1 of w [*, S]: 8 rows' chains side by side.
inline void sum_rows(const float* w, int64_t S, int64_t r0, int64_t r1, float* totals) {
  constexpr int ROWS = 8;
  for (int64_t r = r0; r < r1; r += ROWS) {
    const int n = int(std::min<int64_t>(ROWS, r1 - r));
    float t[ROWS] = {};
    for (int64_t j = 0; j < S; j++)
#pragma GCC unroll 8
      for (int k = 0; k < ROWS; k++)
        if (k < n) t[k] += w[(r + k) * S + j];
    for (int k = 0; k < n; k++) totals[r + k] = t[k];
  }
}

template <typename T>
void pv_block(const float* p, int64_t lds, int rows, const T* v, int64_t ldv, int64_t S, int64_t d0, int64_t width,
              float* acc, int64_t lda) {
  if (width == PV_CHUNK) {
    __m256 a[PV_ROWS][2];
    for (int r = 0; r < PV_ROWS; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t j = 0; j < S; j++) {
      _mm_prefetch(reinterpret_cast<const char*>(v + (j + PV_PREFETCH) * ldv + d0), _MM_HINT_T0);
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
    _mm_prefetch(reinterpret_cast<const char*>(v + (j + PV_PREFETCH) * ldv + d0), _MM_HINT_T0);
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

// The last key row r can see: from the causal rule (no mask: queries are the last Q positions) or the mask row.
inline int64_t last_visible(const float* mrow, int64_t ms, int64_t S, int64_t Q, int64_t i) {
  if (!mrow) return S - Q + i;
  int64_t j = S - 1;
  while (j >= 0 && !(mrow[j * ms] > -1e30f)) j--;
  return j;
}

// The first key the mask row lets row r see (S if none): a sliding window hides every key before it.
inline int64_t first_visible(const float* mrow, int64_t ms, int64_t S) {
  if (!mrow) return 0;
  int64_t j = 0;
  while (j < S && !(mrow[j * ms] > -1e30f)) j++;
  return j;
}

template <typename T, typename Out>
void attend(int isa, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const float* mask,
            const int64_t* mstride, float scale, float softcap, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), S = k.size(2), G = H / Hk, R = G * Q;
  Out* op = reinterpret_cast<Out*>(out.data_ptr());  // [B, Q, H, D] contiguous
  // Rows are scored ROW_CHUNK at a time against the keys from the first to the last one any of them sees: a
  // prefill's scores stay a few MB, its causal half is never computed, and a sliding-window layer reads its window,
  // not the whole cache. The keys left out weigh exactly 0 in every row of the chunk, so each row keeps the bits it
  // has over all S keys.
  const int64_t chunk_rows = std::min(R, ROW_CHUNK);
  // scratch whose every entry is written before it is read: not zeroed (a decoding step's attention is a few
  // microseconds, so its allocations and copies count)
  std::unique_ptr<float[]> scores(new float[chunk_rows * S]), acc(new float[chunk_rows * D]);
  std::vector<float> totals(chunk_rows);
  std::vector<int64_t> last(chunk_rows);
  auto rows = torch::empty({R, D}, q.options());  // one KV head's queries, gathered by memcpy, not four ATen ops
  T* gathered = reinterpret_cast<T*>(rows.data_ptr());
  for (int64_t b = 0; b < B; b++) {
    for (int64_t hk = 0; hk < Hk; hk++) {
      // rows r = i * G + g: query i of head hk * G + g (a chunk holds every head of consecutive queries)
      const T* group = reinterpret_cast<const T*>(q.data_ptr()) + b * q.stride(0) + hk * G * q.stride(1);
      for (int64_t i = 0; i < Q; i++)
        for (int64_t g = 0; g < G; g++)
          std::memcpy(gathered + (i * G + g) * D, group + g * q.stride(1) + i * q.stride(2), D * sizeof(T));
      auto keys = k[b][hk];
      if (keys.stride(0) != D) keys = keys.contiguous();
      torch::Tensor rows32;
      if constexpr (!std::is_same_v<T, float>)
        if (isa != ISA_AVX512BF16) rows32 = rows.to(torch::kFloat32);
      const T* vb = reinterpret_cast<const T*>(v.data_ptr()) + b * v.stride(0) + hk * v.stride(1);
      const int64_t ldv = v.stride(2);
      for (int64_t c0 = 0; c0 < R; c0 += chunk_rows) {
        const int64_t n = std::min(chunk_rows, R - c0);
        auto mask_row = [&](int64_t r) -> const float* {
          const int64_t g = r % G, i = r / G, h = hk * G + g;
          return mask ? mask + b * mstride[0] + h * mstride[1] + i * mstride[2] : nullptr;
        };
        int64_t S0 = S, Sc = 0, first = 0;  // the chunk's keys: S0..Sc - 1
        const float* scanned = nullptr;  // the mask row `first` was found in (a query's heads share one)
        for (int64_t r = 0; r < n; r++) {
          const float* mrow = mask_row(c0 + r);
          last[r] = last_visible(mrow, mstride[3], S, Q, (c0 + r) / G);
          Sc = std::max(Sc, last[r] + 1);
          if (mrow != scanned) first = first_visible(mrow, mstride[3], S), scanned = mrow;
          S0 = std::min(S0, first);
        }
        Sc = std::max<int64_t>(Sc, 1);
        S0 = std::min(S0, Sc - 1);
        const int64_t W = Sc - S0;
        // Rows r0..r1 - 1 of the chunk, start to end: their scores, weights, value products and outputs. A large
        // call runs it once over every row, each step split over the threads (grain 1), as does a call of a few
        // rows over many keys (W * D >= SHARED_KV, under a value block of rows a thread); a small one (a decoding
        // step's few hundred thousand multiply-adds a KV head over a short cache, less than a fork per step costs)
        // splits the rows once, each thread running every step of its rows inline. Each row takes the same steps
        // either way.
        const auto rows_step = [&](int64_t r0, int64_t r1, int64_t grain) {
          const int64_t m = r1 - r0;
          const bool split = grain == 1;
          float* sc = scores.get() + r0 * W;
          if constexpr (std::is_same_v<T, float>) {
            gemm<float, float, float>(ISA_AVX2, rows.data_ptr<float>() + (c0 + r0) * D,
                                      keys.data_ptr<float>() + S0 * D, nullptr, sc, m, W, D, split);
          } else if (isa == ISA_AVX512BF16) {
            gemm<bf16, bf16, float>(isa, reinterpret_cast<const bf16*>(rows.data_ptr()) + (c0 + r0) * D,
                                    reinterpret_cast<const bf16*>(keys.data_ptr()) + S0 * D, nullptr, sc, m, W, D,
                                    split);
          } else {
            gemm<float, bf16, float>(isa, rows32.data_ptr<float>() + (c0 + r0) * D,
                                     reinterpret_cast<const bf16*>(keys.data_ptr()) + S0 * D, nullptr, sc, m, W, D,
                                     split);
          }
          at::parallel_for(r0, r1, grain, [&](int64_t lo, int64_t hi) {
            for (int64_t r = lo; r < hi; r++) {
              const float* mrow = mask_row(c0 + r);
              weights_row(scores.get() + r * W, W, last[r] - S0, mrow ? mrow + S0 * mstride[3] : nullptr,
                          mstride[3], scale, softcap);
            }
            sum_rows(scores.get(), W, lo, hi, totals.data());
          });
          bool done = false;
          if constexpr (std::is_same_v<T, bf16>) {
            if (isa == ISA_AVX512BF16 && D % PV_CHUNK_512 == 0) {
              pv_tasks<PV_ROWS_512, PV_CHUNK_512>(m, D, grain, [&](int64_t p0, int64_t d0) {
                pv_block_512(sc + p0 * W, W, int(std::min<int64_t>(PV_ROWS_512, m - p0)), vb + S0 * ldv, ldv, W,
                             d0, acc.get() + (r0 + p0) * D, D);
              });
              done = true;
            }
          }
          if (!done)
            pv_tasks<PV_ROWS, PV_CHUNK>(m, D, grain, [&](int64_t p0, int64_t d0) {
              pv_block<T>(sc + p0 * W, W, int(std::min<int64_t>(PV_ROWS, m - p0)), vb + S0 * ldv, ldv, W, d0,
                          std::min<int64_t>(PV_CHUNK, D - d0), acc.get() + (r0 + p0) * D, D);
            });
          at::parallel_for(r0, r1, grain, [&](int64_t lo, int64_t hi) {
            const int64_t D8 = D - D % 8;
            for (int64_t r = lo; r < hi; r++) {
              const int64_t g = (c0 + r) % G, i = (c0 + r) / G;
              const float inv = totals[r] > 0.0f ? 1.0f / totals[r] : 0.0f;  // nothing visible (padding): zeros
              Out* o = op + ((b * Q + i) * H + hk * G + g) * D;
              const float* a = acc.get() + r * D;
              for (int64_t d = 0; d < D8; d += 8)
                store8(o + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), _mm256_set1_ps(inv)));
              for (int64_t d = D8; d < D; d++) store(o + d, a[d] * inv);
            }
          });
        };
        const int64_t threads = at::get_num_threads();
        if (n * W * D >= PARALLEL_WORK || (W * D >= SHARED_KV && n < threads * PV_ROWS_512)) {
          rows_step(0, n, 1);
        } else if (n > 1 && threads > 1) {
          at::parallel_for(0, n, (n + 1) / 2, [&](int64_t r0, int64_t r1) {
            rows_step(r0, r1, std::numeric_limits<int64_t>::max());
          });
        } else {
          rows_step(0, n, std::numeric_limits<int64_t>::max());
        }
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
