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
from localspec.settings import COMMANDS, CONFIG_KEYS, SETTINGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def config_path() -> Path:
    """$LOCALSPEC_CONFIG, else config.toml in the user's config directory."""
    if env := os.environ.get("LOCALSPEC_CONFIG"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "localspec" / "config.toml"


def _valid(path: Path, key: str, value: object) -> object:
    try:
        return SETTINGS[key].check(value)  # type: ignore[arg-type]
    except ValueError as e:
        raise LocalspecError(f"{path}: {key} = {value!r}: {e}") from None


def load_config(path: Path | None = None) -> dict[str, object]:
    """The settings in the config file ({} when there is none); a bad file is a one-line error."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise LocalspecError(f"cannot read the config file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise LocalspecError(f"{path}: not UTF-8 text (a TOML file is UTF-8)") from None
    except tomllib.TOMLDecodeError as e:
        raise LocalspecError(f"{path}: not valid TOML ({e})") from None
    if unknown := sorted(set(data) - set(CONFIG_KEYS)):
        raise LocalspecError(f"{path}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    return {key: _valid(path, key, value) for key, value in data.items()}


def effective() -> list[tuple[str, object, str]]:
    """(name, value, where it comes from) of every config setting: environment, config file or default."""
    path = config_path()
    settings = load_config(path)
    rows: list[tuple[str, object, str]] = []
    for key in CONFIG_KEYS:
        setting = SETTINGS[key]
        if setting.env and os.environ.get(setting.env):
            rows.append((key, os.environ[setting.env], f"environment {setting.env}"))
        elif key in settings:
            rows.append((key, settings[key], "config file"))
        else:
            rows.append((key, setting.shown if setting.default is None else setting.default, "default"))
    return rows


def default_map(settings: dict[str, object]) -> dict[str, dict[str, object]]:
    """The config as click's default_map: for each command, the settings that apply to it."""
    return {cmd: {k: v for k, v in settings.items() if k in keys} for cmd, keys in COMMANDS.items()}
