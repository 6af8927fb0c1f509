"""The target model: loading, specnb's decoder over GGUF blocks or checkpoint weights, one forward call, the
CPU kernels, devices."""
