"""The target model: loading, the backend chosen once (Hugging Face's modules, or specnb's decoder over checkpoint
weights or GGUF blocks), one forward call, the KV cache, the CPU kernels, devices."""
