// linear(): a few-row dense linear layer (gemm.h), rows bit-independent.

#include "fewrow.h"
#include "gemm.h"

// x [M, K] and weight [N, K] of one dtype (float32 or bfloat16, contiguous), bias [N] float32 or None.
// Returns [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                     int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "linear: shapes");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "linear: contiguous inputs");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "linear: x and weight dtypes differ");
  const int64_t M = x.size(0), N = weight.size(0), K = x.size(1);
  auto out = torch::empty({M, N}, x.options());
  const float* b = nullptr;
  torch::Tensor bias32;
  if (bias.has_value() && bias->defined()) {
    bias32 = bias->to(torch::kFloat32).contiguous();
    b = bias32.data_ptr<float>();
  }
  if (x.scalar_type() == torch::kFloat32) {
    gemm<float, float, float>(int(isa), x.data_ptr<float>(), weight.data_ptr<float>(), b, out.data_ptr<float>(),
                              M, N, K);
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "linear: float32 or bfloat16");
    const bf16* w = reinterpret_cast<const bf16*>(weight.data_ptr());
    if (isa == ISA_AVX512BF16) {
      gemm<bf16, bf16, at::BFloat16>(int(isa), reinterpret_cast<const bf16*>(x.data_ptr()), w, b,
                                     out.data_ptr<at::BFloat16>(), M, N, K);
    } else {
      const auto x32 = x.to(torch::kFloat32);  // exact; widened once instead of once per weight block
      gemm<float, bf16, at::BFloat16>(int(isa), x32.data_ptr<float>(), w, b, out.data_ptr<at::BFloat16>(), M, N, K);
    }
  }
  return out;
}
