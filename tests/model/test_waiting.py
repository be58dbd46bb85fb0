"""What the user waits for: a draft model costs nothing unless it is used; the times add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.commands import run_cli
from support.costs import CPU_CURVE, GPU_CURVE, write_costs
from support.loads import joined_once_loaded
from support.same import assert_same_tokens

from localspec.api import LocalSpec
from localspec.core.sampling import SamplerSettings
from localspec.decoding.engine import Request
from localspec.decoding.loader import RunConfig, default_threads, draft_drafter, load_engine, store_keys
from localspec.drafting import store
from localspec.drafting.kept import DraftDecision
from localspec.frontends.conversation import Conversation
from localspec.machine import draft_verdict, pair_config

GREEDY = SamplerSettings(temperature=0)
COUNTING = "numbers = [1, 2, 3, 4, 5, 6, 7, 8,"  # a raw prompt whose greedy answer runs as long as it may


@pytest.mark.slow
@pytest.mark.parametrize("ctx", [4096, 1000])  # llama.cpp rounds 1000 up to 1024: the cache keys the setting asked for
def test_a_draft_model_that_cannot_win_is_never_loaded(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: int
) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    write_costs(tmp_path, target_path, draft_path, CPU_CURVE, draft_token=0.021, ctx=ctx)
    written = (tmp_path / "costs.json").read_text()
    cfg = RunConfig(sampler=GREEDY, ctx=ctx, gpu_layers=0, draft_gpu_layers=0)
    engine, policy = load_engine(cfg)
    assert json.loads((tmp_path / "costs.json").read_text()).keys() == json.loads(written).keys()  # nothing measured
    assert store_keys(cfg)[0] == store.model_key(engine.target)  # the key doctor reads is the one the loader used
    config = tmp_path / "config.toml"
    config.write_text(f"ctx = {ctx}\ngpu_layers = 0\ndraft_gpu_layers = 0\n")
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(config))
    assert store_keys(pair_config()) == store_keys(cfg) and draft_verdict(pair_config()).startswith("not loaded")
    assert draft_drafter(engine) is None and [d.name for d in engine.drafters] == ["copier", "recall"]
    assert policy is not None and any("not loaded" in note for note in policy.notes)
    prompt = engine.target.tokenize("def add(a, b):\n    return a + b\n\n# add(2, 3) ==")
    run = engine.generate(Request(tuple(prompt), 16, GREEDY))
    text = "".join(p.text for p in run)
    assert text and run.stats.draft_seconds == 0.0


@pytest.mark.slow
def test_a_first_run_answers_at_once_and_learns(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new machine (no costs kept): nothing is measured and no draft model loaded before the answer, which
    explores it (it is loaded in the answer only for a clear win, priced by the curve the answer measures: on
    this CPU, with a Q4_K_M target, never); the answer's own decodes are the curve the next run starts from;
    there the draft model, ruled out by its size against this CPU's curve, is not loaded either."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    engine, policy = load_engine(RunConfig(sampler=GREEDY, gpu_layers=0, draft_gpu_layers=0))
    drafter = draft_drafter(engine)
    assert engine.target.n_decoded == 0 and drafter is not None and drafter.loaded is None
    assert policy is not None and policy.choice == "explore" and not policy.notes
    prompt = engine.target.tokenize("def add(a, b):\n    return a + b\n\n# add(2, 3) ==")
    assert "".join(p.text for p in engine.generate(Request(tuple(prompt), 12, GREEDY)))
    assert engine.cost is not None and 1 in engine.cost.curve() and drafter.loaded is None
    store.settle(store.model_key(engine.target), engine.cost, policy, 1.0)
    learned = json.loads((tmp_path / "costs.json").read_text())
    assert [list(entry["verify"]) for entry in learned.values()] == [[str(n) for n in engine.cost.curve()]]
    del engine
    write_costs(tmp_path, target_path, None, CPU_CURVE, draft_token=0.0)
    again, policy = load_engine(RunConfig(sampler=GREEDY, gpu_layers=0, draft_gpu_layers=0))
    assert draft_drafter(again) is None and policy is not None
    assert any("by its size" in note for note in policy.notes), policy.notes
    assert draft_verdict(RunConfig(gpu_layers=0, draft_gpu_layers=0)).startswith("not loaded: here it cannot beat")


@pytest.mark.slow
def test_a_draft_model_that_can_win_is_loaded_at_its_first_draft(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft model in use is loaded when it first drafts (once the answer's first tokens have shown how sure
    the target is), and catches up on the whole conversation then."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    write_costs(tmp_path, target_path, draft_path, GPU_CURVE, draft_token=0.002)
    engine, policy = load_engine(RunConfig(sampler=GREEDY, ctx=4096, gpu_layers=0, draft_gpu_layers=0))
    drafter = draft_drafter(engine)
    assert drafter is not None and drafter.loaded is None and policy is not None and policy.choice == "use"
    policy.kept.load = 0.0  # these answers are short: let its load cost nothing, so it drafts from their start
    # First turn with the target alone: the draft model is not even loaded.
    conv = Conversation(LocalSpec(engine, RunConfig(sampler=GREEDY)), max_tokens=40)
    engine.k = 0
    first = "".join(p.text for p in conv.reply("Name three prime numbers."))
    assert first and drafter.loaded is None
    # Second turn under automatic k: the draft is loaded and catches up late, on the whole conversation, and
    # the greedy reply is still the target's own.
    engine.k = None
    second_prompt = conv._rendered(
        conv._fit({"role": "user", "content": "Now list the first twenty prime numbers, one per line."})
    )
    "".join(p.text for p in conv.reply("Now list the first twenty prime numbers, one per line."))
    got = conv.messages[-1]["tokens"]
    assert drafter.loaded is not None
    assert drafter.loaded.n_decoded > len(second_prompt) // 2  # its catch-up covered the conversation
    assert conv.last is not None and conv.last.drafted > 0
    engine.k = 0
    engine.target.reset()
    run = engine.generate(Request(tuple(second_prompt), 40, GREEDY))
    "".join(p.text for p in run)
    assert_same_tokens(engine.target, second_prompt, got, run.tokens)


@pytest.mark.slow
def test_json_times_add_up(target_path: Path, draft_path: Path) -> None:
    proc = run_cli("generate", "--json", "--temperature", "0", "-n", "24", "Write a haiku about the sea.")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    load, ttft, total = out["load_seconds"], out["time_to_first_token"], out["total_seconds"]
    assert 0 < load < ttft <= total
    assert out["first_token_seconds"] <= ttft
    parts = load + out["prefill_seconds"] + out["wall_seconds"]
    assert parts <= total and total - parts < max(0.05 * total, 0.3)  # tokenizing the prompt is the rest


@pytest.mark.slow
def test_a_try_drafts_in_the_answer_and_settles_the_decision(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision due for a try (its wait over, its budget earned): the draft model is loaded and drafts its trial
    rounds in the answer, which equals the target alone's; nothing is measured before it; saving settles the
    decision with the margin its own decodes measured, and a try that kept it out is not repeated next run."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    write_costs(tmp_path, target_path, None, CPU_CURVE, draft_token=0.0)
    entries = json.loads((tmp_path / "costs.json").read_text())
    settings = {"threads": default_threads(), "gpu_layers": 0, "ctx": 4096}
    dkey = store.key(draft_path, **settings)
    next(iter(entries.values()))["decisions"] = {dkey: DraftDecision(runs=3, user_seconds=1e4, margin=0.9).to_json()}
    next(iter(entries.values()))["verify"] = {"1": CPU_CURVE[1]}  # only one size learned: the size bound allows a try
    (tmp_path / "costs.json").write_text(json.dumps(entries))
    spec = LocalSpec.load(gpu_layers=0, draft_gpu_layers=0)
    drafter = draft_drafter(spec.engine)
    assert drafter is not None and drafter.loaded is None and any("tried" in n for n in spec.notes), spec.notes
    assert drafter.policy is not None
    drafter.policy.min_answer = 0  # let its trial start loading it at once
    prompt = COUNTING  # long enough for the draft model to load beside the target and join
    run = spec.generate(prompt, raw=True, temperature=0, max_tokens=96)
    joined_once_loaded(run, drafter)
    assert run.stats.drafted_by.get("draft_model", 0) >= 4 and drafter.loaded is not None
    assert spec.policy is not None and spec.policy.load_seconds > 0
    alone = LocalSpec.load(gpu_layers=0, no_draft=True)
    want = alone.generate(prompt, raw=True, temperature=0, max_tokens=96)
    want.result()
    assert_same_tokens(alone.engine.target, run.prompt_tokens, run.tokens, want.tokens)
    spec.save_costs()
    kept = next(iter(json.loads((tmp_path / "costs.json").read_text()).values()))["decisions"][dkey]
    assert kept["margin"] is not None and kept["last_try"] > 0 and kept["runs"] == 0
    if not kept["uses"]:
        again, _ = load_engine(RunConfig(sampler=GREEDY, gpu_layers=0, draft_gpu_layers=0))
        assert draft_drafter(again) is None


@pytest.mark.slow
def test_a_named_draft_model_drafts_in_the_first_answer(
    target_path: Path, draft_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft model the user names is used from the first answer on a new machine (nothing kept): it loads
    beside the target from the first round and drafts its trial rounds once it is ready, whatever the CPU's
    curve says, and the answer is the target alone's."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    spec = LocalSpec.load(draft=str(draft_path), gpu_layers=0, draft_gpu_layers=0)
    assert spec.policy is not None and spec.policy.choice == "named" and not spec.notes
    run = spec.generate(COUNTING, raw=True, temperature=0, max_tokens=96)
    joined_once_loaded(run, draft_drafter(spec.engine))
    joined = run.stats.first_drafts.get("draft_model")
    assert run.stats.drafted_by.get("draft_model", 0) >= 4 and spec.draft_path == draft_path
    assert joined is not None and joined > 0  # it loaded beside the target, which answered alone meanwhile
    alone = LocalSpec.load(gpu_layers=0, no_draft=True)
    want = alone.generate(COUNTING, raw=True, temperature=0, max_tokens=96)
    want.result()
    assert_same_tokens(alone.engine.target, run.prompt_tokens, run.tokens, want.tokens)
