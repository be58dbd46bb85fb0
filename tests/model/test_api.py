"""The public Python API on the real models: the README's example, a new drafter, predictions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.same import assert_same_tokens

from localspec import LocalSpec
from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.base import Drafter, Offer, register
from localspec.drafting.copier import Copier
from localspec.drafting.costs import CostModel
from localspec.settings import Setting

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs_as_written(target_path: Path, draft_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", readme, re.S)
    assert code, "the README's API example is marked with <!-- api-example -->"
    proc = subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 4 and any("tokens in" in line and "tok/s" in line for line in lines)
    assert "return a + b" in proc.stdout


class FixedList(Drafter):
    """A test drafter: proposes the continuation of a fixed token list from where the output is."""

    name = "fixed"
    max_k: ClassVar[int] = 8

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.prompt_len = tokens, 0

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        self.prompt_len = prompt_len

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        done = len(ctx) - self.prompt_len
        return Offer([0.99**j for j in range(1, len(self.tokens[done : done + k_max]) + 1)])

    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        done = len(ctx) - self.prompt_len
        return list(self.tokens[done : done + k])


@pytest.fixture(scope="module")
def alone(target_path: Path) -> LocalSpec:
    return LocalSpec.load(no_draft=True, ctx=2048)


PROMPT = "List the planets of the solar system, one per line."


@pytest.mark.parametrize("right", [True, False])
def test_a_new_drafter_is_one_class_and_a_registration(alone: LocalSpec, right: bool) -> None:
    """Greedy output with the new drafter equals the target alone's, whether its proposals hold or not."""
    run = alone.generate(PROMPT, temperature=0, max_tokens=40)
    baseline, tokens = run.result(), run.tokens
    proposals = tokens if right else [t + 1 for t in tokens]
    register("fixed", lambda target: FixedList(proposals))
    spec = LocalSpec.load(k=8, copier=False, draft="copier", drafters=["fixed"], ctx=2048)
    out = spec.generate(PROMPT, temperature=0, max_tokens=40)
    assert out.result() == baseline
    drafted, accepted = out.stats.drafted_by["fixed"], out.stats.accepted_by.get("fixed", 0)
    assert drafted > 0 and (accepted >= len(tokens) - 5 if right else accepted == 0)


def test_prediction_speeds_up_without_changing_the_text(alone: LocalSpec) -> None:
    """At a fixed k the prediction drafts from the first round on any machine (the cost-aware default, which the
    server's prediction test runs, may first spend rounds learning the batch curve of a fresh machine)."""
    code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    prompt = f"Rename the parameter w to width in this code; reply with the code only.\n\n{code}"
    baseline = alone.generate(prompt, temperature=0, max_tokens=60).result()
    spec = LocalSpec.load(draft="copier", k=16, ctx=2048)
    good = spec.generate(prompt, temperature=0, max_tokens=60, prediction=baseline)
    assert good.result() == baseline
    assert good.stats.accepted_by.get("prediction", 0) > len(good.tokens) // 2
    wrong = spec.generate(prompt, temperature=0, max_tokens=60, prediction="Something else entirely.\n" * 5)
    assert wrong.result() == baseline


EDIT = (
    "Rename the function area to rect_area everywhere in this code; reply with the code only.\n\n"
    "def area(w, h):\n    return w * h\n\n\ndef total_area(shapes):\n"
    "    return sum(area(w, h) for w, h in shapes)\n"
)


def test_a_seed_gives_the_same_text_with_and_without_drafting(alone: LocalSpec, target) -> None:
    """The API's seed fixes the text whatever drafts: copies here, the draft model at a fixed k there."""
    want = alone.generate(EDIT, temperature=0.9, max_tokens=60, seed=31)
    want.result()
    assert want.seed == 31 and want.stats.drafted == 0
    prompt = alone.tokens(EDIT)
    for spec in (LocalSpec.load(draft="copier", k=8, ctx=2048), LocalSpec.load(k=3, ctx=2048)):  # a fixed k drafts
        got = spec.generate(EDIT, temperature=0.9, max_tokens=60, seed=31)
        got.result()
        assert got.stats.drafted > 0
        assert_same_tokens(target, prompt, got.tokens, want.tokens, SamplerSettings(0.9), 31)
    unseeded = alone.generate(EDIT, temperature=0.9, max_tokens=8)
    assert isinstance(unseeded.seed, int)  # a fresh seed, reported so the run can be repeated


def test_each_generation_owns_its_figures(alone: LocalSpec) -> None:
    first = alone.generate("Say one word.", temperature=0, max_tokens=4)
    first.result()
    figures = first.stats.to_dict()
    second = alone.generate("Count to twenty.", temperature=0, max_tokens=30)
    second.result()
    assert first.stats.to_dict() == figures and second.stats is not first.stats
    assert second.stats.completion_tokens == 30 != first.stats.completion_tokens


def test_tools_and_grammars_through_the_api(target_path: Path, draft_path: Path) -> None:
    """A required call comes back parsed, its markup drafted by the grammar; a bad setting is a ValueError."""
    spec = LocalSpec.load(ctx=2048)
    tool = {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    }
    run = spec.generate("Add 2 and 3 with the tool.", tools=[tool], tool_choice="required", temperature=0)
    run.result()
    (call,) = run.tool_calls
    assert call.name == "add" and isinstance(json.loads(call.arguments), dict)
    assert run.finish_reason == "tool_calls" and run.content == ""
    assert run.stats.accepted_by.get("forced", 0) > 0
    with pytest.raises(ValueError, match="tool_choice"):
        spec.generate("hi", tools=[tool], tool_choice={"type": "function", "function": {"name": "sub"}})
    with pytest.raises(ValueError, match="response_format"):
        spec.generate("hi", response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}})
    with pytest.raises(ValueError, match="logprobs"):
        spec.generate("hi", logprobs=21)


def test_a_fill_in_the_middle_is_known_by_its_suffix_or_its_tokens(target_path: Path) -> None:
    """The copier trusts the context less in a middle (new code beside it) than in an answer that rewrites it:
    the API says which it is, from a suffix or from the model's own FIM tokens in a raw prompt."""
    spec = LocalSpec.load(str(target_path), draft="copier", ctx=2048)
    copier = next(d for d in spec.engine.drafters if d.name == "copier")
    assert isinstance(copier, Copier)
    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("def double(x):\n", {"suffix": "\nprint(double(2))\n"}, True),
        ("<|fim_prefix|>def double(x):\n<|fim_suffix|>\nprint(double(2))\n<|fim_middle|>", {"raw": True}, True),
        ("def double(x):\n", {"raw": True}, False),
    ]
    for prompt, options, fill in cases:
        spec.generate(prompt, temperature=0, max_tokens=4, **options).result()
        assert copier.quotes_input is not fill


def test_generations_keep_their_own_settings_whatever_the_order(target_path: Path, draft_path: Path) -> None:
    """Two generations created, then iterated in the opposite order, each with its own temperature and seed,
    give the texts each gives alone (a generation's settings are its own, never the engine's last)."""
    spec = LocalSpec.load(gpu_layers=0, draft_gpu_layers=0)
    prompt = "Write one sentence about rivers."
    settings = [(0.0, 1), (1.3, 7)]

    def make(temperature: float, seed: int):
        return spec.generate(prompt, temperature=temperature, seed=seed, max_tokens=24)

    alone = []
    for t, seed in settings:
        run = make(t, seed)
        run.result()
        alone.append(run)
    runs = [make(t, seed) for t, seed in settings]
    for run in reversed(runs):
        run.result()
    for run, want, (t, seed) in zip(runs, alone, settings, strict=True):
        assert run.sampler.temperature == t and run.seed == seed
        sampler = SamplerSettings(temperature=t)
        assert_same_tokens(spec.engine.target, run.prompt_tokens, run.tokens, want.tokens, sampler, seed)


def test_options_given_at_load_are_honoured_and_checked_once(
    target_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LocalSpec.load(temperature=0)` makes every generation greedy; a generation's own override wins for it
    alone; each value is checked once, where it is given."""
    checks: list[str] = []
    check = Setting.check

    def counted(self: Setting, value: Any) -> object:
        checks.append(self.name)
        return check(self, value)

    monkeypatch.setattr(Setting, "check", counted)
    spec = LocalSpec.load(target=str(target_path), no_draft=True, temperature=0, ctx=512)
    assert checks.count("temperature") == 1
    checks.clear()
    answers = {spec.generate("Name a color.", max_tokens=8).result() for _ in range(3)}
    assert len(answers) == 1 and "temperature" not in checks  # the session's settings, checked when loaded
    sampled = {spec.generate("Name a color.", max_tokens=8, temperature=1.5, seed=s).result() for s in range(6)}
    assert len(sampled) > 1 and checks.count("temperature") == 6  # each override checked once
    assert spec.generate("Name a color.", max_tokens=8).sampler.temperature == 0  # the override was its own
    with pytest.raises(ValueError, match=r"^temperature: "):
        spec.generate("Name a color.", temperature=-1)
