// rms_norm() and heads(): the small per-row steps of a decoder layer, each one call instead of the ~10
// PyTorch ops (and their dispatch) that Hugging Face's modules spend on them: at one token the dispatch, not the
// arithmetic, is their cost. Each row is reduced sequentially in fp32 (a fixed sequence whatever the number
// of rows, so rows stay bit-independent), and every intermediate that PyTorch's bf16 ops round is rounded at
// the same place.

#include "fewrow.h"

namespace {

inline float round_as(float v, float) { return v; }
inline float round_as(float v, bf16) { return float(at::BFloat16(v)); }

// y = norm(x) per row of d: x * rsqrt(mean(x^2) + eps), then * scale in fp32 (Gemma: scale = 1 + w), or
// rounded to x's dtype first and then * scale (Llama, Qwen2: w * h.to(dtype)).
// The sum of squares in 8 running sums (k mod 8: the 8 lanes of a ymm register, a multiply then an add),
// added pairwise at the end: a fixed order, 8 independent chains.
template <typename T>
inline void norm_row(const T* x, const float* scale, float* y, int64_t d, float eps, bool round_first) {
  const int64_t d8 = d - d % 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < d8; k += 8) {
    const __m256 v = load8<T>(x + k);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, acc);
  for (int64_t k = d8; k < d; k++) {
    const float v = scalar(x[k]);
    part[k % 8] += v * v;
  }
  const float ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  for (int64_t k = 0; k < d8; k += 8) {
    const __m256 h = _mm256_mul_ps(load8<T>(x + k), iv);
    _mm256_storeu_ps(y + k, _mm256_mul_ps(round_first ? round8(h, T{}) : h, _mm256_loadu_ps(scale + k)));
  }
  for (int64_t k = d8; k < d; k++) {
    const float h = scalar(x[k]) * inv;
    y[k] = round_first ? round_as(h, T{}) * scale[k] : h * scale[k];
  }
}

template <typename Out>
inline void store_row(Out* y, const float* v, int64_t d) {
  const int64_t d8 = d - d % 8;
  for (int64_t k = 0; k < d8; k += 8) store8(y + k, _mm256_loadu_ps(v + k));
  for (int64_t k = d8; k < d; k++) store(y + k, v[k]);
}

constexpr int64_t ROW_STEP_WORK = int64_t(1) << 16;  // elements a call's rows must hold to be split over threads

template <typename T, typename Out>
void norm_rows(const T* x, int64_t ldx, const float* scale, Out* y, int64_t R, int64_t d, float eps,
               bool round_first) {
  at::parallel_for(0, R, std::max<int64_t>(1, ROW_STEP_WORK / d), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(d);
    for (int64_t r = r0; r < r1; r++) {
      norm_row(x + r * ldx, scale, row.data(), d, eps, round_first);
      store_row(y + r * d, row.data(), d);
    }
  });
}

// One head vector of D: optional norm, then optional rotary embedding out = x * cos + rotate_half(x) * sin,
// each product and the sum rounded to T as PyTorch's T ops round them.
template <typename T, typename Out>
void head_row(const T* x, const float* scale, float eps, bool round_first, const T* cos, const T* sin, Out* y,
              int64_t D, float* tmp) {
  if (scale) {
    norm_row(x, scale, tmp, D, eps, round_first);
    const int64_t D8 = D - D % 8;
    for (int64_t k = 0; k < D8; k += 8) _mm256_storeu_ps(tmp + k, round8(_mm256_loadu_ps(tmp + k), T{}));
    for (int64_t k = D8; k < D; k++) tmp[k] = round_as(tmp[k], T{});
  } else {
    for (int64_t k = 0; k < D; k++) tmp[k] = scalar(x[k]);
  }
  if (!cos) {
    store_row(y, tmp, D);
    return;
  }
  const int64_t half = D / 2;
  if (half % 8 == 0) {
    const __m256 minus = _mm256_set1_ps(-0.0f);
    for (int64_t k = 0; k < D; k += 8) {
      const __m256 t = _mm256_loadu_ps(tmp + k);
      const __m256 rotated = k < half ? _mm256_xor_ps(_mm256_loadu_ps(tmp + k + half), minus)
                                      : _mm256_loadu_ps(tmp + k - half);
      const __m256 a = round8(_mm256_mul_ps(t, load8<T>(cos + k)), T{});
      const __m256 b = round8(_mm256_mul_ps(rotated, load8<T>(sin + k)), T{});
      store8(y + k, _mm256_add_ps(a, b));
    }
    return;
  }
  for (int64_t k = 0; k < D; k++) {
    const float rotated = k < half ? -tmp[k + half] : tmp[k - half];
    const float a = round_as(tmp[k] * scalar(cos[k]), T{}), b = round_as(rotated * scalar(sin[k]), T{});
    store(y + k, a + b);
  }
}

template <typename T, typename Out>
void heads_impl(const torch::Tensor& x, int64_t H, int64_t D, const float* scale, float eps, bool round_first,
                const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t B = x.size(0), S = x.size(1);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  Out* op = reinterpret_cast<Out*>(out.data_ptr());
  const T* cp = cos.defined() ? reinterpret_cast<const T*>(cos.data_ptr()) : nullptr;
  const T* sp = sin.defined() ? reinterpret_cast<const T*>(sin.data_ptr()) : nullptr;
  const int64_t cb = cp && cos.size(0) > 1 ? cos.stride(0) : 0, cs = cp ? cos.stride(1) : 0;
  at::parallel_for(0, B * S * H, std::max<int64_t>(1, ROW_STEP_WORK / D), [&](int64_t t0, int64_t t1) {
    std::vector<float> tmp(D);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / (S * H), s = (t / H) % S, h = t % H;
      head_row<T, Out>(xp + b * x.stride(0) + s * x.stride(1) + h * D, scale, eps, round_first,
                       cp ? cp + b * cb + s * cs : nullptr, sp ? sp + b * cb + s * cs : nullptr,
                       op + ((b * H + h) * S + s) * D, D, tmp.data());
    }
  });
}

}  // namespace

// x [R, d] (rows may be strided, last dim contiguous), scale [d] float32 -> [R, d] in x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, double eps, bool round_first) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && scale.scalar_type() == torch::kFloat32 &&
              scale.is_contiguous() && scale.numel() == x.size(1), "rms_norm: x [R, d], float32 scale [d]");
  auto out = torch::empty(x.sizes(), x.options());
  if (x.scalar_type() == torch::kFloat32) {
    norm_rows<float, float>(x.data_ptr<float>(), x.stride(0), scale.data_ptr<float>(), out.data_ptr<float>(),
                            x.size(0), x.size(1), float(eps), round_first);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "rms_norm: float32 or bfloat16");
    norm_rows<bf16, at::BFloat16>(reinterpret_cast<const bf16*>(x.data_ptr()), x.stride(0), scale.data_ptr<float>(),
                                  out.data_ptr<at::BFloat16>(), x.size(0), x.size(1), float(eps), round_first);
  }
  return out;
}

// x [B, S, H * D] (last dim contiguous) -> [B, H, S, D] contiguous in x's dtype: each head vector normed
// (scale [D] float32, or None) and rotated (cos / sin [B|1, S, D] in x's dtype, last dim contiguous, or None).
torch::Tensor heads(const torch::Tensor& x, int64_t H, const c10::optional<torch::Tensor>& scale, double eps,
                    bool round_first, const c10::optional<torch::Tensor>& cos, const c10::optional<torch::Tensor>& sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) % H == 0, "heads: x [B, S, H * D]");
  const int64_t D = x.size(2) / H;
  const bool normed = scale.has_value() && scale->defined(), rotated = cos.has_value() && cos->defined();
  TORCH_CHECK(!normed || (scale->scalar_type() == torch::kFloat32 && scale->is_contiguous() && scale->numel() == D),
              "heads: float32 scale [D]");
  torch::Tensor c, s;
  if (rotated) {
    c = *cos;
    s = *sin;
    TORCH_CHECK(c.dim() == 3 && c.sizes() == s.sizes() && c.strides() == s.strides() && c.size(1) == x.size(1) &&
                c.size(2) == D && c.stride(2) == 1 && c.scalar_type() == x.scalar_type() && D % 2 == 0,
                "heads: cos / sin [B|1, S, D] in x's dtype");
  }
  auto out = torch::empty({x.size(0), H, x.size(1), D}, x.options());
  const float* sc = normed ? scale->data_ptr<float>() : nullptr;
  if (x.scalar_type() == torch::kFloat32) {
    heads_impl<float, float>(x, H, D, sc, float(eps), round_first, c, s, out);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "heads: float32 or bfloat16");
    heads_impl<bf16, at::BFloat16>(x, H, D, sc, float(eps), round_first, c, s, out);
  }
  return out;
}
