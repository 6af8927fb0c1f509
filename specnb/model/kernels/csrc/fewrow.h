// specnb's CPU kernels, one PyTorch C++ extension: what each source file defines, and the structs the
// one-call layer stack reads. Every kernel keeps the rows of a call bit-independent (each output element the
// same instruction sequence whatever the other rows), so a verified draft gets the bits of decoding its tokens
// one at a time, in bf16 as in fp32.

#pragma once

#include "common.h"

// linear.cpp: x [M, K] and weight [N, K] of one dtype (float32 or bfloat16, contiguous), bias [N] or None
// -> [M, N] in x's dtype.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                     int64_t isa);

// attention.cpp: q [B, H, Q, D], k / v [B, Hk, S, D], mask None (causal) or float [B|1, H|1, Q, S]
// -> [B, Q, H, D] in q's dtype.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const c10::optional<torch::Tensor>& mask, double scale, double softcap, int64_t isa);

// norms.cpp: RMS norm of x [R, d] -> [R, d]; split into heads x [B, S, H * D] -> [B, H, S, D], normed and rotated.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, double eps, bool round_first);
torch::Tensor heads(const torch::Tensor& x, int64_t H, const c10::optional<torch::Tensor>& scale, double eps,
                    bool round_first, const c10::optional<torch::Tensor>& cos, const c10::optional<torch::Tensor>& sin);

// top_k.cpp: x [R, V] -> (indices int64 [R, k], nan bool [R]).
std::tuple<torch::Tensor, torch::Tensor> top_k(const torch::Tensor& x, int64_t k);

// peak.cpp: multiply-adds per second of one instruction (0: fp32 FMA, 1: vdpbf16ps, 2: vpdpbusd) on every thread.
double peak_rate(int64_t kind, bool avx512, double seconds);

// quant.cpp: linear layers over GGUF blocks (quant.h, quant_int8.h) and the blocks' fp32 values.
namespace quant {
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t type,
                     const c10::optional<torch::Tensor>& bias, int64_t isa);
torch::Tensor dequantize(const torch::Tensor& blocks, int64_t type);
torch::Tensor repack(const torch::Tensor& blocks, int64_t type);
}  // namespace quant

// layers.cpp: the decoder layers in one call, over these specs.
struct Norm {
  torch::Tensor scale;  // float32 [d]
  double eps = 0.0;
  bool round_first = false;
};

// One projection's weight as GGUF blocks (quant::linear): uint8 [N, row bytes] of ggml type `type`; int8: with int8
// activations (quant_int8.h: VNNI tiles on the AVX512 path, AVX2 ones on the AVX2 path), the blocks repacked
// (quant::repack: [N / 16, tile bytes]).
struct Blocks {
  torch::Tensor blocks;
  int64_t type = 0;
  c10::optional<torch::Tensor> bias;
  bool int8 = false;
};

namespace quant {
// x [M, K] times each int8 weight (repacked blocks) -> their outputs side by side: one call over all their tiles;
// vnni: the AVX512-VNNI tiles, else the AVX2 ones.
torch::Tensor linear_int8(const torch::Tensor& x, const std::vector<Blocks>& weights, bool vnni);
}  // namespace quant

struct LayerSpec {
  torch::Tensor qkv, o, gate_up, down;  // dense weights [N, K], q/k/v and gate/up stacked
  c10::optional<torch::Tensor> qkv_bias, o_bias, gate_up_bias, down_bias;
  // or GGUF blocks, one per projection (q, k, v / o / gate, up / down: their formats differ); empty: dense
  std::vector<Blocks> qkv_blocks, o_blocks, gate_up_blocks, down_blocks;
  int64_t q_size = 0, k_size = 0, gate_size = 0, heads = 0, kv_heads = 0;
  double scaling = 1.0, softcap = 0.0;
  c10::optional<Norm> q_norm, k_norm, pre_mlp_norm, post_mlp_norm;  // pre/post mlp: Gemma's sandwich norms
  Norm input_norm, post_attention_norm;
  int64_t act = 0;  // ACT_SILU or ACT_GELU_TANH
};

constexpr int64_t ACT_SILU = 0;
constexpr int64_t ACT_GELU_TANH = 1;

std::tuple<torch::Tensor, std::vector<torch::Tensor>, std::vector<torch::Tensor>> decoder_layers(
    torch::Tensor x, const std::vector<LayerSpec>& layers, const std::vector<torch::Tensor>& cos,
    const std::vector<torch::Tensor>& sin, const std::vector<c10::optional<torch::Tensor>>& masks,
    const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values, int64_t start, int64_t isa);
