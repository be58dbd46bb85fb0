"""What "the same text as the target alone" means in a test, near ties looked at before a difference counts."""

from __future__ import annotations

import numpy as np

from localspec.core.sampling import SamplerSettings, gumbel_scores, process, support
from localspec.llama.model import Model

# Logits: batched and one-token decoding move the top-two gap by 0.07 at the median, 0.39 at p99, 0.79 at
# p99.9 and 1.02 at most over 2,124 positions (scripts/batch_noise.py, a 2-core AMD EPYC); 0.3 failed CI's soak
# test at a gap of 0.44 where two answers came from differently batched rounds.
NEAR_TIE = 1.0


def assert_same_tokens(
    target: Model,
    prompt: list[int],
    got: list[int],
    want: list[int],
    sampler: SamplerSettings | None = None,
    seed: int = 0,
) -> None:
    """Equal token for token, or the first difference is a near tie where the target chose.

    Greedy: of its raw logits. Sampled: of the perturbed scores log p + g that invariant sampling takes the
    argmax of (log p moves by a logit difference over the temperature), or a token at the edge of the
    sampler's cut (top-k, top-p, min-p): one that a logit moved by less than NEAR_TIE takes in or out, since
    a token let in with large noise wins. A prefix (a cut-off answer) is equal.
    """
    n = min(len(got), len(want))
    i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), n)
    if i == n:
        return
    logits = target.sync(prompt + want[:i], 1)[0].copy()
    if sampler is None or sampler.greedy:
        top2, limit = np.sort(logits)[-2:], NEAR_TIE
    else:
        top2, limit = (
            np.sort(gumbel_scores(process(logits, sampler), seed, len(prompt) + i)[1])[-2:],
            NEAR_TIE / sampler.temperature,
        )
        if any(_at_the_cut(logits, sampler, token) for token in (got[i], want[i])):
            return
    gap = float(top2[1] - top2[0])
    assert gap < limit, f"outputs differ at token {i} with a score gap of {gap:.4f} (not a near tie)"


def _at_the_cut(logits: np.ndarray, sampler: SamplerSettings, token: int) -> bool:
    """Whether moving this token's logit by NEAR_TIE either way takes it into or out of the sampler's support."""
    inside = token in support(process(logits, sampler))[0]
    for step in (NEAR_TIE, -NEAR_TIE):
        moved = logits.copy()
        moved[token] += step
        if (token in support(process(moved, sampler))[0]) != inside:
            return True
    return False


def assert_same_constrained(target: Model, prompt: list[int], got: str, want: list[int], grammar: str) -> None:
    """A greedy answer under a grammar: the same text as `want` (the target alone's tokens), or parting at a
    near tie of the logits the grammar allows, at the first of want's tokens that the answer does not hold."""
    from localspec.core.grammar import Constraint
    from localspec.llama.grammar import grammar_tokenizer

    constraint, text, seen = Constraint(grammar_tokenizer(target), grammar, target.n_vocab), got.encode(), b""
    for i, tok in enumerate(want):
        piece = target.piece(tok)
        if not text.startswith(seen + piece) and not target.is_eog(tok):
            logits = constraint.mask(target.sync(prompt + want[:i], 1)[0].copy())
            top2 = np.sort(logits)[-2:]
            gap = float(top2[1] - top2[0])
            assert gap < NEAR_TIE, f"outputs differ at token {i} ({piece!r}) with a gap of {gap:.4f} under the grammar"
            return
        seen += piece
        constraint.advance(tok)
