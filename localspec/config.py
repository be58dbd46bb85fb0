"""The user's config file: default models, k, sampler settings and offload, in TOML.

Precedence is click's own: a flag beats its environment variable (LOCALSPEC_TARGET,
LOCALSPEC_DRAFT), which beats the config file (given to click as its default_map), which beats
the built-in default.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.limits import check

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODELS = ("target", "draft")
SAMPLING = ("k", "temperature", "top_k", "top_p", "min_p")
HARDWARE = ("gpu_layers", "draft_gpu_layers", "threads", "ctx", "flash_attn")
KEYS = MODELS + SAMPLING + HARDWARE
# Which commands each kind of setting reaches (bench keeps its own greedy sampler unless told).
COMMANDS = {"generate": KEYS, "chat": KEYS, "bench": MODELS + HARDWARE}
ENV = {"target": "LOCALSPEC_TARGET", "draft": "LOCALSPEC_DRAFT"}

EXAMPLE = """\
# localspec config: every key is optional; flags and LOCALSPEC_TARGET / LOCALSPEC_DRAFT win over it.
target = "qwen2.5-coder-1.5b-instruct"   # a path, a catalog name, a pulled model or REPO:FILE
draft = "auto"                           # auto, ngram, or a draft model
k = "auto"                               # or a number 0-64
temperature = 0.8
top_k = 40
top_p = 0.95
min_p = 0.05
gpu_layers = -1                          # -1: all layers when the build can offload
draft_gpu_layers = -1
ctx = 4096
flash_attn = false
"""


def config_path() -> Path:
    """$LOCALSPEC_CONFIG, else config.toml in the user's config directory."""
    if env := os.environ.get("LOCALSPEC_CONFIG"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "localspec" / "config.toml"


def _valid(path: Path, key: str, value: object) -> object:
    def bad(why: str) -> LocalspecError:
        return LocalspecError(f"{path}: {key} = {value!r}: {why}")

    if key in MODELS:
        if not isinstance(value, str) or not value:
            raise bad("must be a non-empty string")
    elif key == "flash_attn":
        if not isinstance(value, bool):
            raise bad("must be true or false")
    elif key == "k" and value == "auto":
        pass
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad("must be a number" + (" or \"auto\"" if key == "k" else ""))
    else:
        limit = "gpu_layers" if key == "draft_gpu_layers" else key
        if key in ("k", "top_k", "threads", "ctx", "gpu_layers", "draft_gpu_layers") and not float(value).is_integer():
            raise bad("must be a whole number")
        try:
            check(limit, float(value))
        except ValueError as e:
            raise bad(str(e)) from None
    return value


def load_config(path: Path | None = None) -> dict[str, object]:
    """The settings in the config file ({} when there is none); a bad file is a one-line error."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise LocalspecError(f"cannot read the config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise LocalspecError(f"{path}: not valid TOML ({e})") from None
    if unknown := sorted(set(data) - set(KEYS)):
        raise LocalspecError(f"{path}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    return {key: _valid(path, key, value) for key, value in data.items()}


def default_map(settings: dict[str, object]) -> dict[str, dict[str, object]]:
    """The config as click's default_map: for each command, the settings that apply to it."""
    return {cmd: {k: v for k, v in settings.items() if k in keys} for cmd, keys in COMMANDS.items()}
