// quant::linear(), linear_int8(), repack() and dequantize(): the GGUF-block kernels of quant.h and quant_int8.h's
// int8 route behind the extension's block_linear / block_repack / block_dequantize (and the layer stack's calls).

#include "fewrow.h"
#include "quant.h"
#include "quant_int8.h"

namespace quant {

namespace {

const float* bias_data(const c10::optional<torch::Tensor>& bias, std::vector<torch::Tensor>& keep) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  keep.push_back(bias->to(torch::kFloat32).contiguous());
  return keep.back().data_ptr<float>();
}

void check_input(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "quant.linear: x [M, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "quant.linear: x must be float32 or bfloat16");
}

}  // namespace

// x [M, K] float32 or bfloat16, each of `weights` repacked blocks (repack(): [N_i / 16, tile bytes], int8 set) ->
// [M, sum N_i] in x's dtype: every weight's outputs side by side, as one call over all their tiles. vnni: the
// AVX512-VNNI tiles, else the AVX2 ones (the same bits).
torch::Tensor linear_int8(const torch::Tensor& x, const std::vector<Blocks>& weights, bool vnni) {
  check_input(x);
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<torch::Tensor> keep;
  std::vector<Part> parts;
  int64_t N = 0;
  for (const Blocks& b : weights) {
    const Format f = checked_format(int(b.type));
    const torch::Tensor w = b.blocks.contiguous();
    keep.push_back(w);
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kUInt8, "quant.linear: repacked blocks uint8 [tiles, bytes]");
    TORCH_CHECK(K % f.weights == 0 && w.size(1) == K / f.weights * tile_block_bytes(int(b.type)),
                "quant.linear: x has ", K, " columns, the repacked blocks hold tiles of ", w.size(1), " bytes");
    parts.push_back({w.data_ptr<uint8_t>(), w.size(1), w.size(0), N, bias_data(b.bias, keep), int(b.type)});
    N += w.size(0) * LANES;
  }
  auto out = torch::empty({M, N}, x.options());
  const auto xc = x.contiguous();
  if (x.scalar_type() == torch::kFloat32 && vnni)
    qgemm_int8<true>(xc.data_ptr<float>(), parts, out.data_ptr<float>(), M, N, K);
  else if (x.scalar_type() == torch::kFloat32)
    qgemm_int8<false>(xc.data_ptr<float>(), parts, out.data_ptr<float>(), M, N, K);
  else if (vnni)
    qgemm_int8<true>(xc.data_ptr<at::BFloat16>(), parts, out.data_ptr<at::BFloat16>(), M, N, K);
  else
    qgemm_int8<false>(xc.data_ptr<at::BFloat16>(), parts, out.data_ptr<at::BFloat16>(), M, N, K);
  return out;
}

// x [M, K] float32 or bfloat16 (contiguous), blocks uint8 [N, K / block * bytes] of ggml type `type` (isa ISA_INT8 or
// ISA_INT8_AVX2: repacked, linear_int8), bias [N] or None. Returns [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t type,
                     const c10::optional<torch::Tensor>& bias, int64_t isa) {
  if (isa == ISA_INT8 || isa == ISA_INT8_AVX2) {
    Blocks b;
    b.blocks = blocks, b.type = type, b.bias = bias, b.int8 = true;
    return linear_int8(x, {b}, isa == ISA_INT8);
  }
  const Format f = checked_format(int(type));
  check_input(x);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8, "quant.linear: blocks uint8 [N, bytes]");
  const int64_t M = x.size(0), N = blocks.size(0), K = x.size(1);
  TORCH_CHECK(K % f.weights == 0 && blocks.size(1) == K / f.weights * f.bytes,
              "quant.linear: x has ", K, " columns, the blocks hold rows of ", blocks.size(1), " bytes");
  const auto w = blocks.contiguous();
  std::vector<torch::Tensor> keep;
  const float* b = bias_data(bias, keep);
  auto out = torch::empty({M, N}, x.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = w.size(1);
  const auto x32 = x.to(torch::kFloat32).contiguous();  // exact for bf16
  const float* xp = x32.data_ptr<float>();
  if (isa == ISA_AVX512BF16 && x.scalar_type() == torch::kFloat32)
    qgemm_any_512(int(type), xp, wp, row_bytes, b, out.data_ptr<float>(), M, N, K);
  else if (isa == ISA_AVX512BF16)
    qgemm_any_512(int(type), xp, wp, row_bytes, b, out.data_ptr<at::BFloat16>(), M, N, K);
  else if (x.scalar_type() == torch::kFloat32)
    qgemm_any(int(type), xp, wp, row_bytes, b, out.data_ptr<float>(), M, N, K);
  else
    qgemm_any(int(type), xp, wp, row_bytes, b, out.data_ptr<at::BFloat16>(), M, N, K);
  return out;
}

// blocks uint8 [N, row bytes], N a multiple of 16 -> the int8 route's layout, uint8 [N / 16, tile bytes]
torch::Tensor repack(const torch::Tensor& blocks, int64_t type) {
  const Format f = checked_format(int(type));
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8 && blocks.size(1) % f.bytes == 0 &&
              blocks.size(0) % LANES == 0, "quant.repack: uint8 [N, row bytes], N a multiple of ", LANES);
  const auto w = blocks.contiguous();
  auto out = torch::empty({w.size(0) / LANES, w.size(1) / f.bytes * tile_block_bytes(int(type))}, torch::kUInt8);
  repack_any(int(type), w.data_ptr<uint8_t>(), w.size(1), out.data_ptr<uint8_t>(), out.size(0));
  return out;
}

// blocks uint8 [N, row bytes] -> float32 [N, K]: the weights each call decodes (for tests and inspection).
torch::Tensor dequantize(const torch::Tensor& blocks, int64_t type) {
  const Format f = checked_format(int(type));
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == torch::kUInt8 && blocks.size(1) % f.bytes == 0,
              "quant.dequantize: uint8 [N, row bytes]");
  const auto w = blocks.contiguous();
  const int64_t N = w.size(0), K = w.size(1) / f.bytes * f.weights;
  auto out = torch::empty({N, K}, torch::kFloat32);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
      switch (type) {
        case Q8_0: decode_row<Q8_0>(wp + n * w.size(1), K, y + n * K); break;
        case Q5_0: decode_row<Q5_0>(wp + n * w.size(1), K, y + n * K); break;
        case Q4_K: decode_row<Q4_K>(wp + n * w.size(1), K, y + n * K); break;
        default: decode_row<Q6_K>(wp + n * w.size(1), K, y + n * K); break;
      }
    }
  });
  return out;
}

}  // namespace quant
