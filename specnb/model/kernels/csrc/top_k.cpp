// top_k(): the k largest logits of each row (k = 1 is greedy acceptance's argmax, k = 8 Token Recycling's
// table rows) in one pass over a row instead of PyTorch's max / topk. The pass here compares 8 entries at a time with the current k-th largest and touches scalars only when one
// beats it (rare after the first few thousand), so a row costs about what reading it costs. Ties keep the
// lower index first (argmax's first maximum). A NaN is never picked; rows that hold one are flagged, and the
// caller asks PyTorch for them (PyTorch ranks NaN above everything).

#include "fewrow.h"

namespace {

// The best k (value, index) pairs seen so far, largest first; equal values in the order they were offered.
struct Best {
  int k, n = 0;
  float* value;
  int64_t* index;

  float threshold() const { return n < k ? -std::numeric_limits<float>::infinity() : value[k - 1]; }
  void offer(float v, int64_t i) {  // the caller checked v > threshold() (or n < k)
    int pos = n < k ? n++ : k - 1;
    for (; pos > 0 && value[pos - 1] < v; pos--) {
      value[pos] = value[pos - 1];
      index[pos] = index[pos - 1];
    }
    value[pos] = v;
    index[pos] = i;
  }
};

template <typename T>
bool top_k_row(const T* x, int64_t V, int k, int64_t* out) {
  std::vector<float> value(k);
  Best best{k, 0, value.data(), out};
  int64_t i = 0;
  bool nan = false;
  for (; i < V && best.n < k; i++) {  // the first k entries fill the list (-inf included)
    const float v = scalar(x[i]);
    nan |= std::isnan(v);
    if (!std::isnan(v)) best.offer(v, i);
  }
  __m256 threshold = _mm256_set1_ps(best.threshold());
  __m256 unordered = _mm256_setzero_ps();
  for (; i + 8 <= V; i += 8) {
    const __m256 v = load8(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    int above = _mm256_movemask_ps(_mm256_cmp_ps(v, threshold, _CMP_GT_OQ));
    if (!above) continue;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (; above; above &= above - 1) {
      const int lane = __builtin_ctz(above);
      if (lanes[lane] > best.threshold()) best.offer(lanes[lane], i + lane);
    }
    threshold = _mm256_set1_ps(best.threshold());
  }
  for (; i < V; i++) {
    const float v = scalar(x[i]);
    nan |= std::isnan(v);
    if (v > best.threshold()) best.offer(v, i);
  }
  return nan || _mm256_movemask_ps(unordered) != 0;
}

template <typename T>
void top_k_rows(const T* x, int64_t R, int64_t V, int k, int64_t* out, bool* nan) {
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) nan[r] = top_k_row(x + r * V, V, k, out + r * k);
  });
}

}  // namespace

// x [R, V] float32 or bfloat16, contiguous -> (indices int64 [R, k], largest first, ties to the lower index;
// nan bool [R]: the row holds a NaN and its indices are not PyTorch's).
std::tuple<torch::Tensor, torch::Tensor> top_k(const torch::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && k >= 1 && k <= x.size(1), "top_k: contiguous x [R, V], 1 <= k <= V");
  const int64_t R = x.size(0), V = x.size(1);
  auto indices = torch::empty({R, k}, x.options().dtype(torch::kInt64));
  auto nan = torch::empty({R}, x.options().dtype(torch::kBool));
  if (x.scalar_type() == torch::kFloat32) {
    top_k_rows(x.data_ptr<float>(), R, V, int(k), indices.data_ptr<int64_t>(), nan.data_ptr<bool>());
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "top_k: float32 or bfloat16");
    top_k_rows(reinterpret_cast<const bf16*>(x.data_ptr()), R, V, int(k), indices.data_ptr<int64_t>(),
               nan.data_ptr<bool>());
  }
  return {indices, nan};
}
