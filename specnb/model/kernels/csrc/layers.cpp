// decoder_layers(): a whole stack of decoder layers in one call (specnb/model/decoder.py's Layer, step for step),
// without the Python between the layers' ~12 kernel calls and ~25 small tensor ops. The same kernels and the
// same ATen ops run in the same order on the same dtypes, so the result has the bits of the Python layer.

#include "fewrow.h"

#include <algorithm>

namespace {

constexpr int64_t ACT_WORK = int64_t(1) << 13;  // elements of a share of the activation worth a thread

torch::Tensor normed(const torch::Tensor& x, const Norm& n) {  // x [R, d]
  return rms_norm(x, n.scale, n.eps, n.round_first);
}

// x [R, K] times a projection: the dense weight, or each of its GGUF blocks' outputs side by side.
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& dense, const c10::optional<torch::Tensor>& bias,
                      const std::vector<Blocks>& blocks, int64_t isa) {
  if (blocks.empty()) return linear(x, dense, bias, isa);
  if (std::all_of(blocks.begin(), blocks.end(), [](const Blocks& b) { return b.int8; }))
    return quant::linear_int8(x, blocks, isa == ISA_AVX512BF16);  // siblings in one call
  const int64_t int8 = isa == ISA_AVX512BF16 ? ISA_INT8 : ISA_INT8_AVX2;
  std::vector<torch::Tensor> outs;
  for (const Blocks& b : blocks) outs.push_back(quant::linear(x, b.blocks, b.type, b.bias, b.int8 ? int8 : isa));
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 1);
}

torch::Tensor split_heads(const torch::Tensor& x, int64_t H, const c10::optional<Norm>& n, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  if (!n.has_value()) return heads(x, H, c10::nullopt, 0.0, false, cos, sin);
  return heads(x, H, n->scale, n->eps, n->round_first, cos, sin);
}

// act(gate) * up [R, N] (gate, up: [R, N] views of the gate/up output), the ATen ops of the Python layer on each
// thread's share of the rows: each element takes the same steps, and a 16-row call's GELU runs on every thread.
torch::Tensor activated(const torch::Tensor& gate, const torch::Tensor& up, int64_t act) {
  const int64_t S = gate.size(0), N = gate.size(1);
  auto out = torch::empty({S, N}, gate.options());
  const int64_t grain = std::max<int64_t>(1, ACT_WORK / N);
  if (S <= grain)  // one share: the same ops on the whole, without the fork and the views
    return at::mul_out(out, act == ACT_GELU_TANH ? at::gelu(gate, "tanh") : at::silu(gate), up);
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, S, grain, [&](int64_t r0, int64_t r1) {
    c10::InferenceMode guard(inference);  // the worker threads' mode is the caller's
    const auto g = gate.narrow(0, r0, r1 - r0);
    auto share = out.narrow(0, r0, r1 - r0);
    at::mul_out(share, act == ACT_GELU_TANH ? at::gelu(g, "tanh") : at::silu(g),
                up.narrow(0, r0, r1 - r0));
  });
  return out;
}

// src [B, H, S, D] (last dim contiguous) into dst [B, H, capacity, D] (of src's dtype) at positions start..start+S-1:
// a row copy per (b, h, position), what copy_ does without its dispatch and iterator setup.
void write_rows(const torch::Tensor& dst, const torch::Tensor& src, int64_t start) {
  if (dst.scalar_type() != src.scalar_type() || dst.stride(3) != 1 || src.stride(3) != 1) {
    dst.narrow(2, start, src.size(2)).copy_(src);
    return;
  }
  const int64_t B = src.size(0), H = src.size(1), S = src.size(2), D = src.size(3), size = src.element_size();
  char* out = static_cast<char*>(dst.data_ptr());
  const char* in = static_cast<const char*>(src.data_ptr());
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < S; i++)
        std::memcpy(out + (b * dst.stride(0) + h * dst.stride(1) + (start + i) * dst.stride(2)) * size,
                    in + (b * src.stride(0) + h * src.stride(1) + i * src.stride(2)) * size, D * size);
}

}  // namespace

// x [B, S, d] after the embedding; per layer i: cos[i] / sin[i] [B|1, S, D], masks[i] None (causal) or float
// [B|1, 1, S, start + S], key / value buffers [B, Hk, capacity >= start + S, D] holding the cache's first
// ``start`` positions. Writes the call's keys and values at start..start+S-1 of each buffer and returns the
// last layer's output [B, S, d] (before the final norm), and two empty lists. The B rows share every weight pass
// (rows side by side, core/batched.py), each with the bits it gets alone. With one-row buffers and B > 1 (batch
// verification, kv_cache.py's broadcast call) every row reads the one cached row and nothing is written: the
// call's keys and values [B, Hk, S, D] per layer come back in the two lists instead.
std::tuple<torch::Tensor, std::vector<torch::Tensor>, std::vector<torch::Tensor>> decoder_layers(
    torch::Tensor x, const std::vector<LayerSpec>& layers, const std::vector<torch::Tensor>& cos,
    const std::vector<torch::Tensor>& sin, const std::vector<c10::optional<torch::Tensor>>& masks,
    const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values, int64_t start, int64_t isa) {
  const int64_t n = int64_t(layers.size());
  TORCH_CHECK(x.dim() == 3, "decoder_layers: x [B, S, d]");
  TORCH_CHECK(int64_t(cos.size()) == n && int64_t(sin.size()) == n && int64_t(masks.size()) == n &&
              int64_t(keys.size()) == n && int64_t(values.size()) == n, "decoder_layers: one entry per layer");
  const int64_t B = x.size(0), S = x.size(1), d = x.size(2), R = B * S, end = start + S;
  const bool broadcast = B > 1 && n > 0 && keys[0].size(0) == 1;
  std::vector<torch::Tensor> held_keys, held_values;
  for (int64_t i = 0; i < n; i++) {
    const LayerSpec& L = layers[i];
    const int64_t rows = broadcast ? 1 : B;
    TORCH_CHECK(keys[i].size(0) == rows && values[i].size(0) == rows, "decoder_layers: one cache row per row of x");
    const int64_t filled = broadcast ? start : end;  // what the buffers must hold: read, or read and written
    TORCH_CHECK(keys[i].size(2) >= filled && values[i].size(2) >= filled, "decoder_layers: cache buffer too short");
    const auto h = normed(x.view({R, d}), L.input_norm);
    const auto qkv = project(h, L.qkv, L.qkv_bias, L.qkv_blocks, isa).view({B, S, -1});
    const int64_t kv_end = L.q_size + L.k_size;
    const auto q = split_heads(qkv.narrow(2, 0, L.q_size), L.heads, L.q_norm, cos[i], sin[i]);  // [B, H, S, D]
    const auto k = split_heads(qkv.narrow(2, L.q_size, L.k_size), L.kv_heads, L.k_norm, cos[i], sin[i]);
    const auto v = qkv.narrow(2, kv_end, qkv.size(2) - kv_end).view({B, S, L.kv_heads, -1}).transpose(1, 2);
    torch::Tensor seen_keys, seen_values;  // [B, Hk, end, D]
    if (broadcast) {  // the cached row for every row, then each row's own entries (kept aside, not written)
      seen_keys = torch::cat({keys[i].narrow(2, 0, start).expand({B, -1, -1, -1}), k}, 2);
      seen_values = torch::cat({values[i].narrow(2, 0, start).expand({B, -1, -1, -1}), v}, 2);
      held_keys.push_back(k);
      held_values.push_back(v);
    } else {
      write_rows(keys[i], k, start);
      write_rows(values[i], v, start);
      seen_keys = keys[i].narrow(2, 0, end);
      seen_values = values[i].narrow(2, 0, end);
    }
    const auto out = attention(q, seen_keys, seen_values, masks[i], L.scaling, L.softcap, isa);  // [B, S, H, D]
    auto o = project(out.view({R, -1}), L.o, L.o_bias, L.o_blocks, isa);  // [R, d]
    torch::Tensor x2;
    if (!L.pre_mlp_norm.has_value()) {  // Llama, Qwen2
      x = x.view({R, d}) + o;
      x2 = normed(x, L.post_attention_norm);
    } else {  // Gemma
      x = x.view({R, d}) + normed(o, L.post_attention_norm);
      x2 = normed(x, *L.pre_mlp_norm);
    }
    const auto gu = project(x2, L.gate_up, L.gate_up_bias, L.gate_up_blocks, isa);
    const auto gate = gu.narrow(1, 0, L.gate_size), up = gu.narrow(1, L.gate_size, gu.size(1) - L.gate_size);
    auto down = project(activated(gate, up, L.act), L.down, L.down_bias, L.down_blocks, isa);
    x = (x + (L.post_mlp_norm.has_value() ? normed(down, *L.post_mlp_norm) : down)).view({B, S, d});
  }
  return {x, held_keys, held_values};
}
