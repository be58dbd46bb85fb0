"""`localspec generate` and `localspec models` as a user runs them (real subprocesses, real models)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from support.commands import run_cli
from support.same import assert_same_tokens

from localspec.core.sampling import SamplerSettings
from localspec.frontends.bench import LOOKUP
from localspec.llama.model import Model
from localspec.llama.template import chat_tokens
from localspec.models.gguf import read_gguf

JSON_FIELDS = {
    "text",
    "prompt_tokens",
    "top_k",
    "top_p",
    "min_p",
    "completion_tokens",
    "target_passes",
    "drafted",
    "accepted",
    "acceptance_rate",
    "tokens_per_pass",
    "prefill_seconds",
    "wall_seconds",
    "tokens_per_second",
    "finish_reason",
    "k",
    "temperature",
    "seed",
    "target",
    "draft",
    "notes",
    "load_seconds",
    "time_to_first_token",
    "total_seconds",
    "first_token_seconds",
    "target_seconds",
    "draft_seconds",
    "host_seconds",
    "host_seconds_per_token",
    "host_seconds_per_round",
}


def _json(*args: str, input: bytes | None = None) -> dict:
    proc = run_cli("generate", "--json", *args, input=input)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_generate_json_record(target_path, draft_path) -> None:
    out = _json("Write a haiku about rivers.", "-n", "40", "--seed", "7")
    assert out.keys() >= JSON_FIELDS
    assert out["text"].strip() and out["seed"] == 7 and out["k"] == "auto"
    assert out["accepted"] <= out["drafted"]
    assert out["completion_tokens"] <= out["accepted"] + out["target_passes"]
    host = out["wall_seconds"] - out["target_seconds"] - out["draft_seconds"]  # outside both models' decodes
    assert out["host_seconds"] == pytest.approx(host) and 0 < host < out["wall_seconds"]
    assert out["host_seconds_per_round"] == pytest.approx(host / out["target_passes"])
    assert out["finish_reason"] in ("stop", "length")
    assert out["target"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    if out["draft"] is None:  # left out (on hardware where it cannot win), or not loaded (it waits for a long answer)
        assert "draft_model" not in out["drafted_by"]
    else:
        assert out["draft"].endswith("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def test_streamed_text_and_stats_line(target_path, draft_path) -> None:
    proc = run_cli("generate", "--raw", "--temperature", "0", "-n", "24", "--k", "4", "def fib(n):")
    assert proc.returncode == 0, proc.stderr
    assert "return" in proc.stdout or "if" in proc.stdout
    assert proc.stderr.count("\n") == 1 and "tok/s" in proc.stderr and "acceptance" in proc.stderr


EDIT = (
    "Rename the variable `total` to `acc` in this code and reply with the code only:\n"
    "def sum_list(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    print('total is', total)\n    return total\n\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n"
)


def _same_text(target: Model, prompt: str, got: dict, want: dict) -> None:
    """The same text, or parting at a near tie of the scores the target chose by (checked there)."""
    if got["text"] != want["text"]:
        tokens = chat_tokens(target, [{"role": "user", "content": prompt}])
        sampler = SamplerSettings(want["temperature"], want["top_k"], want["top_p"], want["min_p"])
        tok = target.tokenize
        assert_same_tokens(target, tokens, tok(got["text"]), tok(want["text"]), sampler, want["seed"])


def test_stdin_prompt_and_no_draft_baseline_agree_greedy(target: Model) -> None:
    # copies at a fixed k: the cost-aware choice may, on a CPU, find a round not worth drafting
    spec = _json("--temperature", "0", "-n", "64", "--draft", "copier", "--k", "4", input=EDIT.encode())
    base = _json("--temperature", "0", "-n", "64", "--no-draft", input=EDIT.encode())
    assert spec["drafted"] > 0 and spec["accepted"] > 0  # copies of the code were drafted and verified
    _same_text(target, EDIT, spec, base)
    assert base["drafted"] == 0 and base["draft"] is None
    # one target pass a token, plus one for the end-of-generation token when the reply ends itself
    assert base["target_passes"] == base["completion_tokens"] + (base["finish_reason"] == "stop")


@pytest.mark.parametrize("temperature", ["0.5", "0.9"])
def test_same_seed_same_text_whatever_drafts(target: Model, temperature: str) -> None:
    """Drafter-invariant sampling: one seed, one text, with the target alone and the draft model, and at 0.9 also
    with the default and copies only, each in its own process, on an edit. Copies and the draft model draft at a
    fixed k (so this compares drafted text, not the target alone with itself); the default drafts as its costs
    say, maybe not at all."""
    every = [(), ("--no-draft",), ("--draft", "copier", "--k", "4"), ("--k", "4")]
    runs = {
        " ".join(flags) or "default": _json("--seed", "5", "--temperature", temperature, "-n", "80", *flags, EDIT)
        for flags in (every if temperature == "0.9" else every[1::2])
    }
    alone = runs.pop("--no-draft")
    assert alone["drafted"] == 0 and alone["seed"] == 5
    for name, out in runs.items():
        assert out["drafted"] > 0 or name == "default", name
        _same_text(target, EDIT, out, alone)
    assert runs["--k 4"]["drafted_by"].get("draft_model", 0) > 0  # the draft model sampled with the target's noise


def test_stop_string_not_printed(target_path, draft_path) -> None:
    out = _json("--raw", "--temperature", "0", "-n", "60", "--stop", "3.", "# Steps\n1. Open the box\n2.")
    assert out["finish_reason"] == "stop" and "3." not in out["text"]


def test_vocabulary_mismatch_refused(target_path, gemma_path) -> None:
    proc = run_cli("generate", "hello", "--draft", str(gemma_path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "vocabulary" in proc.stderr and str(gemma_path) in proc.stderr


def test_models_install_is_a_noop_when_verified(target_path, draft_path) -> None:
    proc = run_cli("models", "install")
    assert proc.returncode == 0
    assert proc.stderr.count("already installed and verified") == 2


def test_peak_rss_of_a_generate(target_path, draft_path) -> None:
    """No n_ctx x n_vocab logits buffer: peak RSS of a 96-token answer stays under the two model files plus 600 MB."""
    probe = (
        "import resource, subprocess, sys;"
        "subprocess.run([sys.executable, '-m', 'localspec', 'generate', '--raw', '--json', '-n', '96',"
        " '--temperature', '0', 'import os\\n\\n# A long Python module with many helper functions\\n'],"
        " check=True, stdout=subprocess.DEVNULL);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
    )
    peak = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    limit = target_path.stat().st_size + draft_path.stat().st_size + 600 * 2**20
    print(f"peak RSS {peak / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB")
    assert peak < limit


def test_bench_end_to_end_writes_json_and_png(target_path, draft_path, tmp_path) -> None:
    """Each kind of strategy (the target alone always; a draft model, the copier, auto), a named and an unnamed
    task, one under a grammar (no lookup row), two rounds summed: the JSON, the plot and the table (the small
    model as the target, drafted for by itself: the bench's shape is the subject, for time)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"task": "rename", "prompt": "Rename a to b: def f(a):\\n    return a * 2"}\n'
        '{"prompt": "A greeting as JSON.", "response_format": {"type": "json_object"}}\n'
    )
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    some = "draft_model k=4,copier k=32,auto"
    proc = run_cli(
        "bench", "--prompts", str(prompts), "-n", "12", "--repeat", "2", "--strategies", some, "--target",
        str(draft_path), "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    assert {r["strategy"] for r in data["rows"]} == {"target-only", "draft_model k=4", "copier k=32", "auto", LOOKUP}
    assert {r["task"] for r in data["rows"]} == {"rename", "prompt-2"}
    assert sum(r["strategy"] != LOOKUP for r in data["rows"]) == 2 * 4  # one row each
    assert not any(r["strategy"] == LOOKUP and r["task"] == "prompt-2" for r in data["rows"])  # it takes no grammar
    auto = next(r for r in data["rows"] if r["strategy"] == "auto" and r["task"] == "rename")
    assert 13 <= auto["completion_tokens"] <= 24  # two interleaved rounds of at most 12 tokens, summed
    assert all(r["tokens_per_second"] > 0 for r in data["rows"] if r["strategy"] != LOOKUP)
    assert all(r["clock_tokens_per_second"] > 0 for r in data["rows"])  # every run was timed against the clock
    for r in data["rows"]:
        assert 0 < r["load_seconds"] < r["time_to_first_token"] <= r["total_seconds"]
    copies = next(r for r in data["rows"] if r["strategy"] == "copier k=32" and r["task"] == "rename")
    assert copies["acceptance_rate"] is not None  # the copier drafted on the rename
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "target-only" in proc.stdout and "auto" in proc.stdout


def test_json_schema_grammar_and_logprobs_from_the_command_line(target_path, draft_path, tmp_path) -> None:
    schema = {
        "type": "object",
        "properties": {"language": {"enum": ["python", "rust", "go"]}, "typed": {"type": "boolean"}},
        "required": ["language", "typed"],
        "additionalProperties": False,
    }
    path = tmp_path / "lang.json"
    path.write_text(json.dumps(schema))
    r = _json("--json-schema", str(path), "--logprobs", "2", "--temperature", "0", "-n", "40", "Describe Python.")
    answer = json.loads(r["text"])
    assert set(answer) == {"language", "typed"} and answer["language"] in ("python", "rust", "go")
    assert r["finish_reason"] == "stop" and r["drafted_by"].get("forced", 0) > 0
    assert len(r["logprobs"]) == r["completion_tokens"]
    assert all(e["logprob"] <= 1e-9 and len(e["top_logprobs"]) <= 2 for e in r["logprobs"])
    gbnf = tmp_path / "yesno.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    r = _json("--grammar", str(gbnf), "--temperature", "0", "Is the sky green? Answer yes or no.")
    assert r["text"] in ("yes", "no")


@pytest.mark.slow
def test_bench_requantizes_the_target_once(draft_path, tmp_path) -> None:
    """--requantize Q8_0 benches the target requantized beside it (the draft stands in as a small target)."""
    small = tmp_path / "small-q4_k_m.gguf"
    shutil.copyfile(draft_path, small)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hello."}\n')
    out = tmp_path / "bench.json"
    args = ["bench", "--prompts", str(prompts), "-n", "6", "--strategies", "auto", "--no-lookup", "--json", str(out)]
    proc = run_cli(*args, "--target", str(small), "--requantize", "q8_0")
    assert proc.returncode == 0, proc.stderr
    made = tmp_path / "small-q8_0.gguf"
    assert json.loads(out.read_text())["target"] == str(made) and read_gguf(made).quantization == "Q8_0"
    bad = run_cli(*args, "--target", str(small), "--requantize", "Q3")
    assert bad.returncode == 2 and "Q3" in bad.stderr and "Traceback" not in bad.stderr
