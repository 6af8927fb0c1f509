// The extension's Python module (specnb.model.kernels.extension()).

#include <torch/csrc/utils/pybind.h>  // pybind11 and the Tensor casters; torch/extension.h adds all of torch

#include "fewrow.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("linear", &linear, "few-row linear layer, rows bit-independent");
  module.def("attention", &attention, "decoding attention over the visible keys only, rows bit-independent");
  module.def("rms_norm", &rms_norm, "RMS norm per row, fp32 reduction in order");
  module.def("peak_rate", &peak_rate, "multiply-adds per second of one instruction, from registers, every thread");
  module.def("top_k", &top_k, "indices of the k largest entries of each row, ties to the lower index");
  module.def("heads", &heads, "split into heads [B, H, S, D], with optional per-head norm and rotary embedding");
  pybind11::class_<Norm>(module, "Norm", pybind11::module_local())
      .def(pybind11::init<>())
      .def_readwrite("scale", &Norm::scale)
      .def_readwrite("eps", &Norm::eps)
      .def_readwrite("round_first", &Norm::round_first);
  module.def("block_linear", &quant::linear, "few-row linear layer over GGUF blocks, rows bit-independent");
  module.def("block_repack", &quant::repack, "GGUF blocks to the int8 route's layout, 16 rows interleaved");
  module.def("block_dequantize", &quant::dequantize, "GGUF blocks to float32 rows, as block_linear decodes them");
  pybind11::class_<Blocks>(module, "Blocks", pybind11::module_local())
      .def(pybind11::init<>())
      .def_readwrite("blocks", &Blocks::blocks)
      .def_readwrite("type", &Blocks::type)
      .def_readwrite("bias", &Blocks::bias)
      .def_readwrite("int8", &Blocks::int8);
  pybind11::class_<LayerSpec>(module, "LayerSpec", pybind11::module_local())
      .def(pybind11::init<>())
#define FIELD(name) .def_readwrite(#name, &LayerSpec::name)
      FIELD(qkv) FIELD(o) FIELD(gate_up) FIELD(down) FIELD(qkv_bias) FIELD(o_bias) FIELD(gate_up_bias) FIELD(down_bias)
      FIELD(q_size) FIELD(k_size) FIELD(gate_size) FIELD(heads) FIELD(kv_heads) FIELD(scaling) FIELD(softcap)
      FIELD(q_norm) FIELD(k_norm) FIELD(pre_mlp_norm) FIELD(post_mlp_norm) FIELD(input_norm)
      FIELD(post_attention_norm) FIELD(act) FIELD(qkv_blocks) FIELD(o_blocks) FIELD(gate_up_blocks) FIELD(down_blocks);
#undef FIELD
  module.attr("ACT_SILU") = ACT_SILU;
  module.attr("ACT_GELU_TANH") = ACT_GELU_TANH;
  module.def("decoder_layers", &decoder_layers, "a stack of decoder layers in one call (specnb.model.decoder's Layer)");
}
