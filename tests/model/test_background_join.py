"""A draft model loading beside the target's work joins mid-answer and changes no token (the real models)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.costs import GPU_CURVE, write_costs
from support.loads import joined_once_loaded, load_threads
from support.same import assert_same_tokens

from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Request
from localspec.decoding.loader import RunConfig, draft_drafter, load_engine


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [SamplerSettings(temperature=0), SamplerSettings(temperature=0.8, top_k=40)])
def test_a_draft_model_joining_mid_answer_gives_the_target_alones_text(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampler: SamplerSettings
) -> None:
    """A draft model in use starts loading at the answer's first round, on its own thread; the target decodes
    alone until it is ready, and it drafts from a later token. The text is the target alone's (greedy and
    seeded), and the figures say when it joined and what its load cost the target."""
    import json

    from localspec.api import Generation

    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    write_costs(tmp_path, target_path, draft_path, GPU_CURVE, draft_token=0.002, ctx=2048)
    engine, policy = load_engine(RunConfig(sampler=sampler, ctx=2048, gpu_layers=0, draft_gpu_layers=0, recall=False))
    drafter = draft_drafter(engine)
    assert drafter is not None and drafter.loaded is None and policy is not None and policy.choice == "use"
    prompt = engine.target.tokenize("def fibonacci(n):\n    ", add_bos=True)
    run = Generation(engine, Request(tuple(prompt), 96, sampler, seed=5))
    joined_once_loaded(run, drafter)
    joined = run.stats.first_drafts.get("draft_model")
    assert drafter.loaded is not None and joined is not None and joined > 1, run.stats.first_drafts
    assert run.stats.draft_load_beside is not None and run.stats.draft_load_beside >= 0
    assert "draft model drafting from token" in run.stats.summary()
    assert json.dumps(run.stats.to_dict())  # --json carries them
    got = run._run.tokens
    engine.k = 0
    engine.target.reset()
    alone = engine.generate(Request(tuple(prompt), 96, sampler, seed=5))
    "".join(p.text for p in alone)
    assert_same_tokens(engine.target, prompt, got, alone.tokens, sampler, seed=5)
    assert not load_threads()
