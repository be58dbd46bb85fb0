"""Shared fixtures: the real GGUF models (installed and verified on first use), loaded once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localspec.core.sampling import SamplerSettings, gumbel_scores, process, support
from localspec.llama.model import Model
from localspec.models.catalog import catalog, models_dir
from localspec.models.install import install

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
OTHER_VOCAB = "gemma-3-270m"

# A suite started in the background (nohup, `&` without job control) inherits SIGINT as ignored, and so
# would every localspec it starts: the Ctrl-C tests would see nothing. Restore Python's own handling.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


MODEL_FIXTURES = {"target_path", "draft_path", "gemma_path", "target", "draft", "reference", "bad_files"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs a GGUF model is in the slow tier (`-m "not slow"` runs the rest)."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def user_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point every user directory at a temporary folder: no test reads or writes the user's own files.

    One folder for the whole session, so the decode costs are measured once. The models stay where
    they are installed (the checkout's models/ unless LOCALSPEC_MODELS_DIR says otherwise).
    """
    home = tmp_path_factory.mktemp("user")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_MODELS_DIR", str(models_dir()))
        for var, sub in [
            ("LOCALSPEC_CACHE_DIR", "cache"),
            ("LOCALSPEC_DATA_DIR", "data"),
            ("XDG_CACHE_HOME", "xdg-cache"),
            ("XDG_DATA_HOME", "xdg-data"),
            ("XDG_CONFIG_HOME", "xdg-config"),
            ("HF_HOME", "hf"),
        ]:
            mp.setenv(var, str(home / sub))
        mp.setenv("LOCALSPEC_CONFIG", str(home / "no-config.toml"))
        for var in ("LOCALSPEC_TARGET", "LOCALSPEC_DRAFT", "LOCALSPEC_API_KEY", "HF_HUB_CACHE", "HF_TOKEN"):
            mp.delenv(var, raising=False)
        yield home


def model_path(name: str) -> Path:
    """Install (a no-op once verified) and return the path of a catalog model."""
    return install(catalog()[name], models_dir())


@pytest.fixture(scope="session")
def target_path() -> Path:
    return model_path(TARGET)


@pytest.fixture(scope="session")
def draft_path() -> Path:
    return model_path(DRAFT)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return model_path(OTHER_VOCAB)


@pytest.fixture(scope="session")
def target(target_path: Path) -> Model:
    return Model(target_path, n_ctx=2048)


@pytest.fixture(scope="session")
def draft(draft_path: Path) -> Model:
    return Model(draft_path, n_ctx=2048)


def run_cli(
    *args: str, input: bytes | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real `localspec` command in a subprocess (bytes in, text out; env adds variables)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", *args], input=input, capture_output=True, timeout=timeout, env=env
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    )


def npm_installed(tmp_path_factory: pytest.TempPathFactory, package: str, binary: str) -> Path:
    """`package` installed by npm into a temporary folder: the path of its `binary` (the test skipped where npm is
    missing or cannot fetch the package)."""
    import shutil

    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    root = tmp_path_factory.mktemp(binary)
    got = subprocess.run([npm, "install", "--prefix", str(root), package], capture_output=True, timeout=600)
    if got.returncode != 0:
        pytest.skip(f"npm could not install {package}: {got.stderr.decode(errors='replace')[-400:]}")
    return root / "node_modules" / ".bin" / binary


def joined_once_loaded(run: Iterable[Any], drafter: Any) -> None:
    """Run a generation to its end; where its draft model is loading beside it, wait for that load once (the
    target goes on alone meanwhile), so it joins within the answer however fast this machine loads it."""
    for _ in run:
        if drafter.loading is not None:
            drafter.loading.result()


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2 with exactly one line on stderr, containing each needle, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


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
