"""The decoding loop: draft trees, verification, acceptance, sampling, the KV cache, generate() and its
statistics."""
