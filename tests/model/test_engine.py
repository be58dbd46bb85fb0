"""The speculative loop on the real model pair: greedy equality, stats, stops, cache trimming."""

from __future__ import annotations

import numpy as np
import pytest
from llama_cpp import Llama
from support.same import NEAR_TIE, assert_same_tokens

from localspec.core.sampling import SamplerSettings
from localspec.core.stats import Stats
from localspec.decoding.engine import Engine, Request
from localspec.decoding.loader import make_drafters
from localspec.drafting.copier import Copier
from localspec.drafting.draft_model import DraftModelDrafter
from localspec.llama.model import Model, new_llama
from localspec.llama.template import chat_tokens, raw_tokens

GREEDY = SamplerSettings(temperature=0)
PROMPTS = [
    'def merge_sort(items):\n    """Sort a list with merge sort."""\n',
    "The three most important ideas in thermodynamics are",
    "# Shopping list\n1. Apples\n2.",
]


def _run(
    target: Model,
    draft: Model | None,
    prompt: list[int],
    k: int,
    n: int = 64,
    sampler: SamplerSettings = GREEDY,
    seed: int = 0,
    stops=(),
) -> tuple[list[int], str, Stats]:
    run = Engine(target, [DraftModelDrafter(draft)] if draft is not None else [], k).generate(
        Request(tuple(prompt), n, sampler, seed, tuple(stops))
    )
    text = "".join(p.text for p in run)
    return run.tokens, text, run.stats


@pytest.fixture(scope="module")
def reference(target_path) -> Llama:
    """Plain llama-cpp-python, its own sampler, as the outside reference (new_llama: the AMX guard only)."""
    return new_llama(model_path=str(target_path), n_ctx=2048, verbose=False)


@pytest.mark.parametrize(("text", "k"), zip(PROMPTS, (1, 4, 8), strict=True))
def test_greedy_equals_target_alone_and_llama_cpp(target, draft, reference, text, k) -> None:
    """Each prompt at its own draft length: k 1, 4 and 8 are each held to the target alone and to llama.cpp."""
    prompt = raw_tokens(target, text)
    baseline, baseline_text, _ = _run(target, None, prompt, 0)
    ref = reference.create_completion(text, max_tokens=64, temperature=0.0)["choices"][0]["text"]
    assert baseline_text == ref  # the target-alone path is plain greedy llama.cpp decoding
    assert len(baseline) == 64
    tokens, spec_text, stats = _run(target, draft, prompt, k)
    assert_same_tokens(target, prompt, tokens, baseline)
    if tokens == baseline:
        assert spec_text == baseline_text
    assert stats.drafted > 0 and stats.target_passes < 64  # drafts were accepted: fewer target passes


def test_stats_add_up_when_sampling(target, draft) -> None:
    prompt = chat_tokens(target, [{"role": "user", "content": "Name five colours, one per line."}])
    for seed in range(3):
        tokens, _, s = _run(target, draft, prompt, 4, n=48, sampler=SamplerSettings(), seed=seed)
        assert s.accepted <= s.drafted
        assert s.completion_tokens == len(tokens) <= s.accepted + s.target_passes
        assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
        assert s.finish_reason in ("stop", "length")


def test_same_seed_same_text(target, draft) -> None:
    """From the same (empty) cache state, a seed fixes the sampled text."""
    prompt = raw_tokens(target, "Once upon a time")
    runs = []
    for _ in range(2):
        target.reset()
        draft.reset()
        runs.append(_run(target, draft, prompt, 4, n=24, sampler=SamplerSettings(), seed=123)[0])
    assert runs[0] == runs[1]


def test_eos_stops_the_loop(target, draft) -> None:
    prompt = chat_tokens(target, [{"role": "user", "content": "Reply with just the word: yes"}])
    tokens, text, stats = _run(target, draft, prompt, 4, n=64)
    assert stats.finish_reason == "stop" and len(tokens) < 10
    assert "<|im_end|>" not in text and text.strip().lower().startswith("yes")


def test_stop_string_ends_mid_block_and_is_not_printed(target, draft) -> None:
    prompt = raw_tokens(target, PROMPTS[2])
    full = _run(target, draft, prompt, 8, n=40)[1]
    assert "4." in full
    _tokens, text, stats = _run(target, draft, prompt, 8, n=40, stops=["4."])
    assert stats.finish_reason == "stop"
    assert text == full[: full.index("4.")]


def test_caches_hold_exactly_the_accepted_prefix(target, draft) -> None:
    prompt = raw_tokens(target, PROMPTS[0])
    tokens, _, _ = _run(target, draft, prompt, 4, n=30)
    ctx = prompt + tokens
    for m in (target, draft):
        assert m.tokens == ctx[: len(m.tokens)]  # never a rejected draft token
    assert len(target.tokens) >= len(ctx) - 1 - 4  # at most the last round's unread tail is missing
    # the tracked cache is what llama.cpp holds: decoding the next token from it matches a fresh prefill
    cached = target.sync(ctx, 1)[0]
    target.reset()
    fresh = target.sync(ctx, 1)[0]
    assert int(np.argmax(cached)) == int(np.argmax(fresh))


def test_max_tokens_exact(target, draft) -> None:
    tokens, _, stats = _run(target, draft, raw_tokens(target, PROMPTS[1]), 8, n=13)
    assert len(tokens) == 13 and stats.finish_reason == "length"


EDIT = (
    "Rename the variable `total` to `acc` in this code and reply with the code only:\n"
    "def sum_list(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    print('total is', total)\n    return total\n"
)


QUOTE = (
    "Repeat this note word for word as one paragraph, on a single line:\n\n"
    "The council met on Tuesday and agreed to extend the opening\nhours of the central library "
    "until ten in the evening on\nweekdays, starting in March, after residents asked for more\n"
    "quiet places to study.\n"
)


@pytest.mark.parametrize(("text", "k"), [(EDIT, None), (EDIT, 32), (QUOTE, None)])
def test_ngram_drafting_keeps_greedy_output(target, text, k) -> None:
    """Copying drafts (fixed k = 32, and the planner) change nothing in the greedy text.

    QUOTE's answer joins the source's wrapped lines: the drafter learns to copy across them.
    """
    from localspec.drafting.costs import CostModel

    cost = CostModel({1: 0.054, 2: 0.071, 4: 0.129, 8: 0.342, 16: 0.462, 32: 0.576})
    prompt = chat_tokens(target, [{"role": "user", "content": text}])
    baseline = _run(target, None, prompt, 0, n=80)[0]
    engine = Engine(target, make_drafters(target, copier=True), k, cost=cost)
    run = engine.generate(Request(tuple(prompt), 80, GREEDY))
    "".join(p.text for p in run)
    stats = run.stats
    assert_same_tokens(target, prompt, run.tokens, baseline)
    assert stats.accepted >= len(baseline) // 4 and stats.target_passes < 0.8 * len(baseline)
    copier = next(d for d in engine.drafters if d.name == "copier")
    assert isinstance(copier, Copier) and copier.join_lines == (text is QUOTE)


def test_logits_span_batch_chunks(draft_path) -> None:
    """Logits asked for across several llama.cpp batches are each position's own, not a later batch's."""
    small = Model(draft_path, n_ctx=64, n_batch=8)
    tokens = raw_tokens(small, "".join(PROMPTS))[:20]
    chunked = small.sync(tokens, 14).copy()  # 20 new tokens in batches of 8: logits from all three
    small.reset()
    one_by_one = np.stack([small.sync(tokens[:i], 1)[0].copy() for i in range(7, 21)])
    top2 = np.sort(one_by_one, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= NEAR_TIE  # a near tie may flip between batch shapes
    assert len(tokens) == 20 and clear.sum() >= 5 and (chunked.argmax(1) == one_by_one.argmax(1))[clear].all()
    assert np.abs(chunked - one_by_one).max() < 0.5


def test_sampled_output_follows_the_target_with_a_real_drafter(target, draft) -> None:
    """Chi-square of the first two tokens of 200 seeded generations (the second drafted by the draft model and
    verified) against the target's own p(t1) p(t2 | t1), at significance 1e-3; rare pairs are pooled."""
    from scipy.stats import chisquare

    from localspec.core.sampling import process, support

    sampler, prompt = SamplerSettings(), raw_tokens(target, "My favourite colour is")
    counts: dict[tuple[int, int], int] = {}
    drafted = 0
    for seed in range(200):
        tokens, _, stats = _run(target, draft, prompt, 1, n=3, sampler=sampler, seed=seed)
        counts[tokens[0], tokens[1]] = counts.get((tokens[0], tokens[1]), 0) + 1
        drafted += stats.drafted_by.get("draft_model", 0)
    assert drafted >= 160  # the second token was a verified model draft in (nearly) every run
    expected: dict[tuple[int, int], float] = {}
    ids1, p1 = support(process(target.sync(prompt, 1, prompt=True)[0].copy(), sampler))  # as the engine prefills
    for t1, q1 in zip(ids1.tolist(), p1, strict=True):
        ids2, p2 = support(process(target.sync([*prompt, t1], 1)[0].copy(), sampler))
        for t2, q2 in zip(ids2.tolist(), p2, strict=True):
            expected[t1, t2] = 200 * q1 * q2
    assert set(counts) <= set(expected)  # nothing outside the target's support
    common = [pair for pair, e in expected.items() if e >= 5]
    observed = [counts.get(pair, 0) for pair in common] + [200 - sum(counts.get(pair, 0) for pair in common)]
    wanted = [expected[pair] for pair in common] + [200 - sum(expected[pair] for pair in common)]
    assert len(common) >= 3 and chisquare(observed, wanted).pvalue > 1e-3
