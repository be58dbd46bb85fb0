"""Settings, the config file and command-line usage errors, in process and without a model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from localspec.config import load_config
from localspec.errors import LocalspecError
from localspec.frontends.cli import app
from localspec.settings import CHAT_SETTABLE, CONFIG_KEYS, SETTINGS, default


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("k", "auto", "auto"),
        ("k", "8", 8),
        ("temperature", "0", 0.0),
        ("top_p", "1", 1.0),
        ("seed", "42", 42),
        ("flash_attn", "on", True),
        ("max_tokens", "1", 1),
    ],
)
def test_parse_accepts(name: str, text: str, value: object) -> None:
    assert SETTINGS[name].parse(text) == value


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("k", "-1"),
        ("k", "65"),
        ("k", "x"),
        ("k", "2.5"),
        ("temperature", "nan"),
        ("temperature", "inf"),
        ("top_p", "0"),
        ("min_p", "2"),
        ("max_tokens", "0"),
        ("seed", "-5"),
        ("ctx", "-1"),
        ("flash_attn", "maybe"),
    ],
)
def test_parse_refuses_with_what_is_wanted(name: str, text: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        SETTINGS[name].parse(text)


def test_every_setting_has_help_and_a_valid_default() -> None:
    for setting in SETTINGS.values():
        assert setting.help.endswith(".") and setting.flags[0].startswith("--")
        assert setting.check(setting.default) == setting.default
    assert set(CHAT_SETTABLE) <= set(SETTINGS) and set(CONFIG_KEYS) <= set(SETTINGS)


def test_config_file_is_checked_against_the_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('k = "auto"\ntemperature = 0.2\nctx = 8192\nflash_attn = true\n')
    assert load_config(path) == {"k": "auto", "temperature": 0.2, "ctx": 8192, "flash_attn": True}
    for bad, why in [
        ("ctx = 10.5", "whole number"),
        ("temperature = -1", "temperature"),
        ("flash_attn = 1", "true or false"),
        ("volume = 3", "unknown setting"),
        ("k = [1]", "auto"),
    ]:
        path.write_text(bad + "\n")
        with pytest.raises(LocalspecError, match=why):
            load_config(path)
    path.write_bytes(b"temperature = 0.5 # \xff\xfe\n")
    with pytest.raises(LocalspecError, match="not UTF-8"):
        load_config(path)


def test_a_config_that_is_not_utf8_is_one_line_and_help_still_shows(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_bytes(b"temperature = 0.5 # \xff\xfe\n")
    env = {**os.environ, "LOCALSPEC_CONFIG": str(tmp_path / "config.toml")}
    run = subprocess.run([sys.executable, "-m", "localspec", "--help"], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "generate" in run.stdout and "not UTF-8" in run.stderr
    run = subprocess.run([sys.executable, "-m", "localspec", "models", "list"], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "not UTF-8" in run.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--k", "-1"),
        ("--k", "1000"),
        ("--temperature", "nan"),
        ("--top-p", "0"),
        ("--min-p", "2"),
        ("--max-tokens", "0"),
        ("--ctx", "-1"),
        ("--threads", "0"),
        ("--temperature", "inf"),
        ("--seed", "x"),
    ],
)
def test_bad_flag_values_are_usage_errors_naming_the_flag(flag: str, value: str) -> None:
    result = CliRunner().invoke(app, ["generate", "hello", flag, value])
    assert result.exit_code == 2 and flag in result.output and "Traceback" not in result.output


def test_every_option_has_help() -> None:
    import typer.main

    def commands(group: Any) -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = []
        for name, sub in group.commands.items():
            found += commands(sub) if hasattr(sub, "commands") else [(name, sub)]
        return found

    found = commands(typer.main.get_command(app))
    assert {"generate", "chat", "serve", "bench", "install", "show"} <= {name for name, _ in found}
    for name, command in found:
        assert command.help, name
        for param in command.params:
            assert param.param_type_name == "argument" or param.help, f"{name} {param.name}"


def test_every_default_is_the_settings_tables() -> None:
    """RunConfig, run_config, LocalSpec.load and .generate, the sampler and the bench's options take their defaults from
    the one table (the bench's own choices named here), so a setting is described once."""
    import dataclasses
    import inspect

    import typer

    from localspec.api import LocalSpec, run_config
    from localspec.core.sampling import SamplerSettings
    from localspec.decoding.loader import RunConfig
    from localspec.frontends.cli import app

    def same(name: str, default: object) -> None:
        want = SETTINGS[name].default
        assert default == want or (want == "auto" and default is None), (name, default, want)

    for f in dataclasses.fields(RunConfig):
        if f.name in SETTINGS and f.default is not dataclasses.MISSING:
            same(f.name, f.default)
    for f in dataclasses.fields(SamplerSettings):
        same(f.name, f.default)
    for fn in (run_config, LocalSpec.load):
        for p in inspect.signature(fn).parameters.values():
            if p.name in SETTINGS:
                same(p.name, p.default)
    for p in inspect.signature(LocalSpec.generate).parameters.values():  # None: the session's, else the table's
        assert p.name not in SETTINGS or p.default is None, p.name
    bench = next(c for c in typer.main.get_command(app).commands.values() if c.name == "bench")  # type: ignore[attr-defined]
    own = {"max_tokens": 400, "temperature": 0.0, "seed": 0}  # the bench's: long greedy answers, one fixed seed
    for p in bench.params:
        if p.name in SETTINGS:
            if p.name in own:
                assert p.default == own[p.name], p.name
            else:
                same(p.name, p.default)
    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    for name in ("generate", "chat", "serve"):
        for p in commands[name].params:
            if p.name in SETTINGS:
                assert p.default == default(p.name, name), (name, p.name, p.default)
    from localspec.frontends.conversation import Conversation
    from localspec.frontends.server.settings import ServerSettings

    assert Conversation.__dataclass_fields__["max_tokens"].default == default("max_tokens", "chat")
    server = ServerSettings()
    for name in ("host", "port", "max_queue", "max_connections", "client_timeout", "max_body"):
        assert getattr(server, name) == default(name), name


def test_the_run_settings_are_declared_once() -> None:
    """settings.RUN is where a run's settings are named: every one is an option of each command that loads a pair
    (generate, chat, serve), a keyword run_config and LocalSpec.load take (the table's checks applied), and a
    field of RunConfig (the sampler's gathered in its SamplerSettings); a name outside it is refused."""
    import dataclasses

    import typer

    from localspec.api import run_config
    from localspec.decoding.loader import RunConfig
    from localspec.settings import RUN, SAMPLER

    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    for name in ("generate", "chat", "serve"):
        assert set(RUN) <= {p.name for p in commands[name].params}, name
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(RUN) - set(SAMPLER) <= fields
    cfg = run_config(k=3, temperature=0.5, exact=True, cache_disk=0)
    assert (cfg.k, cfg.sampler.temperature, cfg.exact, cfg.cache_disk) == (3, 0.5, True, 0)
    with pytest.raises(ValueError, match="cache_ram"):
        run_config(cache_ram=-1)
    with pytest.raises(TypeError, match="kv"):
        run_config(kv=3)
