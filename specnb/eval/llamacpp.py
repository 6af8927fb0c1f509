"""llama.cpp as a peer in the bench: plain decoding (``llamacpp``) and its prompt-lookup drafting
(``llamacpp-pld``), through the maintained ``llama-cpp-python`` binding, on the embedded model's GGUF file.

This is what a CPU user would most likely run instead of PyTorch. Its weights are the GGUF's (Gemma-3-270M:
Q4_K_M, ~4.5 bits per weight), so its tokens are not ours and its tok/s is not comparable one to one: compare
the fraction of the read bandwidth each reaches (``weight_bytes``: the bytes of the file's tensors a decoding step
reads, :func:`streamed_bytes`).
The prompt goes in as our token ids (same vocabulary), greedy (top-k 1), and is prefilled whole every time, as
ours is: left alone, llama-cpp-python keeps the cached prefix a prompt shares with the last one (a chat template's
opening, or the whole prompt after the bench's warm-up) and prefills only the rest. Optional: ``pip install
llama-cpp-python`` builds llama.cpp from source (about ten minutes on two cores).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core.prompts import Prompt, encode_prompt
from ..model.gguf_file import open_gguf
from ..model.model_names import gguf_file
from ..model.models import EMBEDDED, LoadedModel


def embedded_gguf(target: LoadedModel) -> Path:
    """The GGUF file the embedded model was converted from (joined by ``specnb models fetch``)."""
    path = gguf_file(target.name)
    if target.name not in EMBEDDED or not path.exists():
        raise ValueError(f"llamacpp methods need an embedded model's GGUF file ({', '.join(EMBEDDED)}, fetched "
                         f"with `specnb models fetch`); {target.name!r} has none at {path}")
    return path


def streamed_bytes(path: Path) -> int:
    """Bytes of the GGUF file's tensors one decoding step reads: every tensor but the token embedding table where
    the file has an output head of its own (a step reads one row of the table; Qwen2.5-Coder-1.5B's is 131 of its
    1,117 MB). Where the head is the table (tied, as Gemma-3's), the step reads it whole."""
    tensors = open_gguf(path).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    return sum(t.data.nbytes for t in tensors if not (untied and t.name == "token_embd.weight"))


def check_available() -> None:
    """Raise a one-line error when the binding is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ValueError("the llamacpp methods need llama-cpp-python: pip install llama-cpp-python "
                         "(builds llama.cpp from source, ~10 min on 2 cores)")


def runner(method: str, target: LoadedModel, max_context: int, draft_tokens: int = 10
           ) -> Callable[[Prompt, int], dict]:
    """A bench runner (prompt, max_new_tokens) -> result dict for ``llamacpp`` or ``llamacpp-pld``."""
    check_available()
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = embedded_gguf(target)
    draft = LlamaPromptLookupDecoding(num_pred_tokens=draft_tokens) if method == "llamacpp-pld" else None
    llm = Llama(model_path=str(path), n_ctx=max_context, n_threads=torch.get_num_threads(),
                n_threads_batch=torch.get_num_threads(), draft_model=draft, verbose=False)
    eos = set(target.eos_token_ids) | {llm.token_eos()}
    weight_bytes = streamed_bytes(path)

    def run(prompt: Prompt, max_new_tokens: int) -> dict:
        ids = encode_prompt(target, prompt).tolist()
        tokens: list[int] = []
        start = time.perf_counter()
        llm.reset()  # n_tokens = 0: generate() finds no cached prefix to keep
        for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if token in eos or len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return {"new_tokens": len(tokens), "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
                # one call per token for plain decoding; llama.cpp does not report its speculative calls
                "calls": len(tokens) - 1 if draft is None else float("nan"),
                "weight_bytes": weight_bytes, "tokens": tokens}

    return run


def cost_curve(target: LoadedModel, tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 64), context: int = 256,
               repeats: int = 8, seed: int = 0) -> list[dict]:
    """llama.cpp's cost of one call of each of ``tokens`` after a ``context``-token prefix, on the same GGUF file
    and threads: the median of ``repeats`` ``Llama.eval`` calls, the KV cache cut back to the prefix before each,
    logits for every token of a call (``logits_all``: a verification call needs them all, as ours computes them).
    Rows ``tokens``, ``seconds``, ``slowdown`` (over one token), ``context``, ``passes``: the columns of
    :func:`specnb.eval.timing.time_cells` that a curve needs."""
    check_available()
    from llama_cpp import Llama

    llm = Llama(model_path=str(embedded_gguf(target)), n_ctx=context + max(tokens) + 1,
                n_batch=max(512, max(tokens)), n_threads=torch.get_num_threads(),
                n_threads_batch=torch.get_num_threads(), logits_all=True, verbose=False)
    generator = torch.Generator().manual_seed(seed)
    vocab = llm.n_vocab()
    llm.eval(torch.randint(vocab, (context,), generator=generator).tolist())
    calls = {n: torch.randint(vocab, (n,), generator=generator).tolist() for n in tokens}
    times: dict[int, list[float]] = {n: [] for n in tokens}
    for repeat in range(repeats + 1):  # the first pass warms up
        for n in tokens:
            llm.n_tokens = context  # keep the prefix: eval() writes after n_tokens, overwriting the old call
            start = time.perf_counter()
            llm.eval(calls[n])
            if repeat:
                times[n].append(time.perf_counter() - start)
    one = sorted(times[tokens[0]])[repeats // 2]
    return [{"tokens": n, "seconds": sorted(s)[repeats // 2], "slowdown": sorted(s)[repeats // 2] / one,
             "context": context, "passes": repeats} for n, s in times.items()]
