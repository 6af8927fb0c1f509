"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks."""

from .decode import Generation, generate
from .draft import Draft
from .models import LoadedModel, load_model, tiny_model
from .prompts import Prompt

__all__ = ["Draft", "Generation", "LoadedModel", "Prompt", "generate", "load_model", "tiny_model"]
