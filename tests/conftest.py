"""Shared fixtures: the real GGUF models (installed and verified on first use), loaded once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

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


MODEL_TIERS = ("model", "process")  # tests/model (real models in process), tests/process (CLI and server processes)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tiers are the folders: tests/unit needs no model; tests/model and tests/process are the slow tier (`-m
    "not slow"` runs the rest). A test whose fixtures disagree with its folder is an error, not a slow unit test."""
    for item in items:
        tier = Path(str(item.path)).parent.name
        slow = bool(MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))) or item.get_closest_marker("slow")
        if bool(slow) != (tier in MODEL_TIERS):
            raise pytest.UsageError(f"{item.nodeid}: {'a' if slow else 'no'} model tier test in tests/{tier}")
        if slow:
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
