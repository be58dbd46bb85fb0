"""The fast sampling chain on the real target's logits: it picks what the full-vocabulary reference picks."""

from __future__ import annotations

from support.reference_sampling import SAMPLERS, assert_same, process_before, process_reference

from localspec.core.sampling import InvariantSampling, process


def test_real_logits_pick_as_the_reference(target) -> None:
    """The target's own logits over an answer: the same support, probabilities and tokens at every position."""
    prompt = target.tokenize("def fibonacci(n):\n    ", add_bos=False)
    sampling = InvariantSampling(5)
    tokens = list(prompt)
    for pos in range(24):
        logits = target.sync(tokens, 1)[0].copy()
        for s in SAMPLERS:
            got, want = process(logits, s), process_reference(logits, s)
            assert_same(got, want)
            assert sampling.pick(got, pos) == sampling.pick(process_before(logits, s), pos)
        tokens.append(sampling.pick(process(logits, SAMPLERS[0]), pos))
