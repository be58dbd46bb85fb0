"""llama-cpp-python's own prompt-lookup speculative decoding: only the bench's outside reference."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from localspec.llama.model import new_llama


def prompt_lookup_llama(path: Path, *, n_ctx: int, n_threads: int | None) -> llama_cpp.Llama:
    """A Llama with llama-cpp-python's prompt-lookup drafting (10 tokens a round).

    Its speculative path reads scores at every position and, given a draft_model, turns logits_all on
    itself, but sizes its score array from the flag as passed: without logits_all=True here it fails
    with a numpy broadcast error. That array is n_ctx x n_vocab floats, so this reference (only) runs
    with a context just big enough for the prompt and the answer; localspec asks only where needed.
    """
    return new_llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        logits_all=True,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10),
        verbose=False,
    )
