"""One prepared GPU run: localspec's cost curve, draft-model verdict and predicted speedups on a CUDA device.

A GPU machine may have no network, and the model files are large to copy, so the run is prepared on a machine
with the network and the installed models:

    python scripts/gpu_check.py prepare          # gpu-bundle/: trimmed llama.cpp sources, model headers, wheels

then one command on the GPU machine, with gpu-bundle/ copied beside the checkout (about 8 minutes):

    bash scripts/gpu-check --out DIR             # build with CUDA for that GPU only, then `run`

`run` writes random-weight twins of the default pair (the real headers: shapes, quantization types and
vocabulary; a decode's cost does not depend on the values), calibrates them as localspec does (verify cost
for 1..64 tokens, the draft token and its catch-up, the draft model's verdict), loads the draft model on its own
thread while the target decodes alone (the load's seconds, the token the target reached meanwhile, what it slowed
the target's decodes), runs the default against `--no-draft` (greedy; outputs compared by the near-tie rule; the
token the draft model joined at), replays the recorded answers (scripts/replay.py) against the
measured curve for the copier's predicted speedups, and writes one table to --out (gpu-table.md, .json).
Everything but the CUDA build runs on a CPU too (`run --gpu-layers 0`, tested in tests/model/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

LLAMA_CPP_PYTHON = "0.3.36"
# the vendored llama.cpp a CUDA build needs (the rest of the 77 MB sdist is docs, models, tools and tests)
KEEP = ("CMakeLists.txt", "LICENSE", "cmake", "ggml", "src", "include", "common", "vendor")
DROP_BACKENDS = ("ggml-sycl", "ggml-vulkan", "ggml-opencl", "ggml-cann", "ggml-metal", "ggml-musa", "ggml-webgpu")
WHEELS = ("scikit-build-core", "pathspec", "packaging", "diskcache", "jinja2", "typing-extensions", "platformdirs")
WHEELS_BEFORE_3_11 = ("tomli", "exceptiongroup")  # scikit-build-core's, on Python 3.10
BINARY_WHEELS = ("llguidance", "markupsafe")  # per CPython version and platform
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a mutex is, in three sentences.",
]


def prepare(bundle: Path) -> None:
    """gpu-bundle/: llama-cpp-python's sdist with its llama.cpp trimmed, the default pair's headers, wheels."""
    if bundle.exists():
        shutil.rmtree(bundle)
    (bundle / "wheels").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d"]
        subprocess.run([*pip, tmp, "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
        with tarfile.open(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/"))
        dst = bundle / "llama-cpp-python"
        for name in ("CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE.md", "llama_cpp"):
            _copy(src / name, dst / name)
        for name in KEEP:
            _copy(src / "vendor/llama.cpp" / name, dst / "vendor/llama.cpp" / name)
        for name in DROP_BACKENDS:
            shutil.rmtree(dst / "vendor/llama.cpp/ggml/src" / name, ignore_errors=True)
    wheels = str(bundle / "wheels")
    subprocess.run([*pip, wheels, "--only-binary", ":all:", *WHEELS, *WHEELS_BEFORE_3_11], check=True)
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    for version in ("3.10", "3.11", "3.12", "3.13"):
        binary = ["--only-binary", ":all:", "--python-version", version, *platforms]
        subprocess.run([*pip, wheels, *binary, *BINARY_WHEELS], check=True)
    write_headers(bundle)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    print(f"{bundle}: {size / 2**20:.1f} MiB")


def write_headers(bundle: Path, target: Path | None = None, draft: Path | None = None) -> None:
    """The headers of the pair (default: the default pair) the twins are made from."""
    from twin import header_of

    from localspec.models.catalog import default_pair, resolve

    pair = default_pair()
    bundle.mkdir(parents=True, exist_ok=True)
    for role, path, model in (("target", target, pair[0]), ("draft", draft, pair[1])):
        (bundle / f"{role}.header").write_bytes(header_of(path or resolve(model.name)))


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


def run(bundle: Path, out: Path, *, gpu_layers: int, tokens: int, models: Path | None) -> dict[str, Any]:
    """Twins, calibration, the default against --no-draft, the replay; the table in `out`."""
    from replay import replay

    os.environ.setdefault("LOCALSPEC_CACHE_DIR", tempfile.mkdtemp(prefix="gpu-check-cache-"))

    from twin import write_twin

    from localspec.core.sampling import SamplerSettings
    from localspec.decoding.engine import Request
    from localspec.decoding.loader import RunConfig, load_engine
    from localspec.llama.model import build
    from localspec.llama.template import chat_tokens

    out.mkdir(parents=True, exist_ok=True)
    work = models or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    t0 = time.perf_counter()
    paths = {
        role: write_twin((bundle / f"{role}.header").read_bytes(), work / f"{role}-twin.gguf", seed=i)
        for i, role in enumerate(("target", "draft"))
    }
    result: dict[str, Any] = {"device": _device(), "backends": build().backends}
    result["twins_seconds"] = time.perf_counter() - t0
    cost = _calibrated(paths, gpu_layers, result)
    result["beside"] = beside_load(paths, gpu_layers=gpu_layers, tokens=max(tokens, 16))
    greedy = SamplerSettings(temperature=0)
    result["runs"] = []
    for prompt in PROMPTS:
        row: dict[str, Any] = {"prompt": prompt}
        answers: dict[str, list[int]] = {}
        for way, cfg in (
            ("default", RunConfig(target=str(paths["target"]), draft=str(paths["draft"]), sampler=greedy)),
            ("k4_sampled", RunConfig(target=str(paths["target"]), draft=str(paths["draft"]), k=4, copier=False)),
            ("no_draft", RunConfig(target=str(paths["target"]), no_draft=True, sampler=greedy)),
        ):
            cfg.gpu_layers = cfg.draft_gpu_layers = gpu_layers
            engine, policy = load_engine(cfg)
            ids = chat_tokens(engine.target, [{"role": "user", "content": prompt}])
            row[way], answers[way] = _timed_run(engine, policy, Request(tuple(ids), tokens, cfg.sampler))
            if way == "no_draft":
                row["same"] = _same_by_near_tie(engine.target, ids, answers["default"], answers[way])
            del engine, policy
        row["speedup"] = row["no_draft"]["seconds"] / row["default"]["seconds"]
        result["runs"].append(row)
    curve = out / "verify-curve.json"
    curve.write_text(json.dumps({str(n): s for n, s in cost.curve().items()}))
    replayed = replay(ROOT / "scripts" / "replay-answers.json", curve)
    result["replay"] = {str(r["task"]): float(r["plain_seconds"]) / float(r["seconds"]) for r in replayed}
    (out / "gpu-table.json").write_text(json.dumps(result, indent=1))
    (out / "gpu-table.md").write_text(table(result))
    print(table(result))
    return result


def _calibrated(paths: dict[str, Path], gpu_layers: int, result: dict[str, Any]) -> Any:
    """The pair's measured costs (into `result`: the verify curve, the draft's costs, the predicted speedups),
    loaded as the default run loads them, so the costs kept are the ones its runs start from."""
    from localspec.decoding.loader import default_threads
    from localspec.drafting.calibration import calibrate
    from localspec.drafting.costs import best_k
    from localspec.drafting.prior import ASSUMED_ALPHA, clear_win
    from localspec.llama.model import Model

    target, draft = (Model(paths[r], n_threads=default_threads(), n_gpu_layers=gpu_layers) for r in ("target", "draft"))
    cost = calibrate(target, draft)
    t1 = cost.verify_cost(1)
    result["verify_ms"] = {n: s * 1e3 for n, s in cost.curve().items()}
    result["draft_token"] = cost.draft_token / t1
    result["draft_prefill_token"] = cost.draft_prefill_token / t1
    result["model_can_win"] = clear_win(cost)
    result["draft_model_predicted"] = {
        f"{alpha:.2f}": best_k([alpha**j for j in range(1, 17)], cost, cost.draft_token)[1] * t1
        for alpha in (0.6, 0.8, ASSUMED_ALPHA)
    }
    return cost


def _timed_run(engine: Any, policy: Any, request: Any) -> tuple[dict[str, Any], list[int]]:
    """One generation's figures (its seconds, where a round's time went, where the draft model joined) and tokens."""
    start = time.perf_counter()
    run_ = engine.generate(request)
    for _ in run_:
        pass
    st = run_.stats
    return {
        "seconds": time.perf_counter() - start,
        "notes": policy.notes if policy else [],
        # where a round's time goes: the target's decodes, the draft model's, the host's (the rest)
        "ms_per_round": {
            part: seconds * 1e3 / max(st.target_passes, 1)
            for part, seconds in (("target", st.target_seconds), ("draft", st.draft_seconds), ("host", st.host_seconds))
        },
        "host_ms_per_token": (st.host_per_token or 0.0) * 1e3,
        "joined": st.first_drafts.get("draft_model"),
    }, run_.tokens


def beside_load(paths: dict[str, Path], *, gpu_layers: int, tokens: int) -> dict[str, Any]:
    """The draft model loading on its own thread (draft_model.BackgroundLoad, as the default loads it) while the
    target decodes greedily alone from its 8th token: the load's seconds, the token the target had reached when it
    was ready, and the target's milliseconds a token before it and while it ran."""
    from functools import partial

    from localspec.decoding.loader import default_threads
    from localspec.drafting.draft_model import BackgroundLoad
    from localspec.llama.model import Model
    from localspec.llama.template import chat_tokens

    threads = default_threads()
    target = Model(paths["target"], n_threads=threads, n_gpu_layers=gpu_layers)
    ctx = chat_tokens(target, [{"role": "user", "content": PROMPTS[0]}])
    logits = target.sync(ctx, 1)
    alone: list[float] = []
    during: list[float] = []
    load, started, ready_at, load_seconds = None, 0.0, None, None
    for i in range(tokens):
        if i == 8:
            started = time.perf_counter()
            load = BackgroundLoad(partial(Model, paths["draft"], n_threads=threads, n_gpu_layers=gpu_layers), ctx)
        ctx.append(int(np.argmax(logits[-1])))
        t0 = time.perf_counter()
        logits = target.sync(ctx, 1)
        (during if load is not None and ready_at is None else alone).append(time.perf_counter() - t0)
        if load is not None and ready_at is None and load.ready():
            ready_at, load_seconds = i + 1, time.perf_counter() - started
    if load is not None and ready_at is None:
        load.result()
        load_seconds = time.perf_counter() - started
    if load is not None:
        load.cancel()
    ms_alone = 1e3 * float(np.median(alone)) if alone else 0.0
    ms_during = 1e3 * float(np.median(during)) if during else ms_alone
    return {
        "load_seconds": load_seconds,
        "ready_at_token": ready_at,
        "ms_alone": ms_alone,
        "ms_beside": ms_during,
        "slowdown": ms_during / ms_alone if ms_alone else 1.0,
    }


def _same_by_near_tie(target: Any, prompt: list[int], got: list[int], want: list[int]) -> str:
    """'equal', 'near tie at i (gap g)', or 'DIFFERENT at i (gap g)': greedy texts compared as the tests do."""
    i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if i is None:
        return "equal"
    top2 = np.sort(target.sync(prompt + want[:i], 1)[0])[-2:]
    gap = float(top2[1] - top2[0])
    return f"{'near tie' if gap < 1.0 else 'DIFFERENT'} at {i} (gap {gap:.3f})"


def _device() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no NVIDIA GPU (CPU)"


def table(r: dict[str, Any]) -> str:
    """The run as one markdown table (and a line of context above it)."""
    lines = [
        f"Device: {r['device']} (llama.cpp backends: {', '.join(r['backends'])}); random-weight twins of the default pair.",
        "",
        "| measure | value |",
        "|---|---|",
        "| verify ms for 1/2/4/8/16/32/64 tokens | " + " / ".join(f"{ms:.1f}" for ms in r["verify_ms"].values()) + " |",
        f"| draft token, in target decodes | {r['draft_token']:.2f} |",
        f"| draft catch-up per token, in target decodes | {r['draft_prefill_token']:.3f} |",
        f"| draft model can win (at 90% acceptance) | {'yes' if r['model_can_win'] else 'no'} |",
    ]
    lines += [
        f"| draft model, predicted decode × at {alpha} acceptance | {x:.2f} |"
        for alpha, x in r["draft_model_predicted"].items()
    ]
    beside = r.get("beside")
    if beside:
        ready = beside["ready_at_token"]
        lines.append(
            f"| draft model loaded beside the target: seconds, ready at token, target ms a token alone / beside | "
            f"{beside['load_seconds'] or 0:.2f} / {ready if ready is not None else 'after the answer'} / "
            f"{beside['ms_alone']:.1f} / {beside['ms_beside']:.1f} ({beside['slowdown']:.2f}×) |"
        )
    lines += [f"| copier replay, predicted decode ×: {task} | {x:.2f} |" for task, x in r["replay"].items()]
    lines += [
        f"| default vs --no-draft, measured × (random twins): {row['prompt'][:40]} | "
        f"{row['speedup']:.2f} ({row['same']}"
        + (f"; draft model from token {row['default']['joined']}" if row["default"].get("joined") is not None else "")
        + ") |"
        for row in r["runs"]
    ]
    lines += [
        f"| ms a round, target / draft / host, {way}: {row['prompt'][:40]} | "
        + " / ".join(f"{ms:.2f}" for ms in row[way]["ms_per_round"].values())
        + f" (host {row[way]['host_ms_per_token']:.3f} ms a token) |"
        for row in r["runs"]
        for way in ("no_draft", "default", "k4_sampled")
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="build gpu-bundle/ here (needs the network and the installed models)")
    prep.add_argument("--bundle", type=Path, default=ROOT / "gpu-bundle")
    go = sub.add_parser("run", help="twins, calibration, pairs and the replay; the table in --out")
    go.add_argument("--bundle", type=Path, default=ROOT / "gpu-bundle")
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--gpu-layers", type=int, default=999)
    go.add_argument("--tokens", type=int, default=128)
    go.add_argument("--models", type=Path, help="where to write the twins (default: a temporary folder)")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.bundle)
    else:
        run(args.bundle, args.out, gpu_layers=args.gpu_layers, tokens=args.tokens, models=args.models)


if __name__ == "__main__":
    main()
