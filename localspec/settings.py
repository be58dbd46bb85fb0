"""Every user setting in one table: its type, range, default and help.

The command-line options, the chat's /set, the config file's validation and `config show` are all
made from this table, so a setting is described once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Value = int | float | bool | str | None
TRAINED_CTX_CAP = 32_768  # ctx 0 takes the target's trained context up to this (a 128k model's cache would not fit)


@dataclass(frozen=True)
class Setting:
    """One setting. kind is int, float, bool or str; auto: "auto" is a value too (k); optional: so is None."""

    name: str
    kind: type
    default: Value
    help: str
    flags: tuple[str, ...]
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    auto: bool = False
    optional: bool = False
    env: str | None = None
    in_config: bool = True  # may be set in the config file
    in_chat: bool = False  # may be changed with /set in chat
    shown: str | None = None  # how `config show` names a None default
    per_command: tuple[tuple[str, Value], ...] = ()  # (command, its own default) where a command differs

    @property
    def range_text(self) -> str:
        if self.low is None or self.high is None:
            return ""
        if self.kind is int:
            return f"[{int(self.low)}, {int(self.high)}]"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def check(self, value: Value) -> Value:
        """The value if it is valid, else ValueError saying what is wanted."""
        if (value is None and self.optional) or (value == "auto" and self.auto):
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError("must be true or false")
            return value
        if self.kind is str:
            if not isinstance(value, str) or not value:
                raise ValueError("must be a non-empty string")
            return value
        wanted = "a whole number" if self.kind is int else "a number"
        if self.auto:
            wanted = f"'auto' or {wanted}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be {wanted}")
        if self.kind is int and not float(value).is_integer():
            raise ValueError(f"must be {wanted}")
        if (
            self.low is not None
            and self.high is not None
            and (
                not math.isfinite(value)
                or value < self.low
                or value > self.high
                or (self.low_open and value == self.low)
            )
        ):
            raise ValueError(f"must be {wanted} in {self.range_text}")
        return int(value) if self.kind is int else float(value)

    def parse(self, text: str) -> Value:
        """A value typed by the user (a flag, /set), checked."""
        if self.auto and text == "auto":
            return "auto"
        if self.kind is bool:
            if text.lower() in ("true", "on", "yes", "1"):
                return True
            if text.lower() in ("false", "off", "no", "0"):
                return False
            raise ValueError("must be true or false")
        if self.kind is str:
            return self.check(text)
        try:
            number: float = int(text) if self.kind is int else float(text)
        except ValueError:
            raise ValueError(
                f"must be {'a whole number' if self.kind is int else 'a number'}"
                f"{' or auto' if self.auto else ''}{' in ' + self.range_text if self.range_text else ''}"
            ) from None
        return self.check(number)

    def typer_option(self, *, default_help: str = "") -> Any:
        """The typer.Option of this setting (ranges checked by a callback: usage errors name the flag)."""
        import typer

        def checked(value: Any) -> Any:
            if value is None or isinstance(value, bool):
                return value
            try:
                return self.parse(value) if isinstance(value, str) else self.check(value)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None

        text = self.help + (f" Range {self.range_text}." if self.range_text and self.kind is not int else "")
        if self.kind is int and self.range_text:
            text += f" Range {self.range_text}."
        flags = self.flags if self.kind is not bool else (f"{self.flags[0]}/--no-{self.flags[0][2:]}",)
        return typer.Option(
            *flags, callback=checked, help=text + default_help, envvar=self.env, show_envvar=self.env is not None
        )


_INT_MAX = 1_000_000
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting(
            "target",
            str,
            None,
            "Target GGUF: a path, a catalog name, a pulled model's name, or REPO:FILE on the "
            "Hugging Face Hub (pulled on first use). Default: the default pair's target.",
            ("--target", "-t"),
            optional=True,
            env="LOCALSPEC_TARGET",
            shown="(the default pair's)",
        ),
        Setting(
            "draft",
            str,
            "auto",
            "Drafter: 'auto' (n-gram copying, plus the default draft model where its measured "
            "costs say it can win here), 'copier' (copying from the prompt and output only, no draft model; 'ngram' "
            "is the same), or a "
            "draft GGUF with the target's vocabulary (anything --target takes).",
            ("--draft", "-d"),
            env="LOCALSPEC_DRAFT",
        ),
        Setting(
            "k",
            int,
            "auto",
            "Draft tokens per round: 'auto' picks the fastest k each round from this machine's "
            "measured costs (0 included); a number fixes it (0 = target alone).",
            ("--k",),
            0,
            64,
            auto=True,
            in_chat=True,
        ),
        Setting(
            "temperature",
            float,
            0.8,
            "Sampling temperature; 0 is greedy (the target's argmax).",
            ("--temperature", "--temp"),
            0.0,
            10.0,
            in_chat=True,
        ),
        Setting("top_k", int, 40, "Keep the k most likely tokens (0 = off).", ("--top-k",), 0, _INT_MAX, in_chat=True),
        Setting(
            "top_p",
            float,
            0.95,
            "Keep the smallest set of tokens with this much probability (1 = off).",
            ("--top-p",),
            0.0,
            1.0,
            low_open=True,
            in_chat=True,
        ),
        Setting(
            "min_p",
            float,
            0.05,
            "Drop tokens less likely than this fraction of the most likely one (0 = off).",
            ("--min-p",),
            0.0,
            1.0,
            in_chat=True,
        ),
        Setting(
            "seed",
            int,
            None,
            "Random seed (default: a fresh one, reported in --json).",
            ("--seed",),
            0,
            2**32 - 1,
            optional=True,
            in_config=False,
            in_chat=True,
        ),
        Setting(
            "max_tokens",
            int,
            512,
            "Stop after this many new tokens (a chat's reply: 1024).",
            ("--max-tokens", "-n"),
            1,
            _INT_MAX,
            in_config=False,
            in_chat=True,
            per_command=(("chat", 1024),),
        ),
        Setting(
            "ctx",
            int,
            4096,
            f"Context window in tokens, for both models; 0: the target's trained context, up to {TRAINED_CTX_CAP:,} "
            "(serve's default: agents send thousands of tokens of tools and instructions).",
            ("--ctx",),
            0,
            1_048_576,
            per_command=(("serve", 0),),
        ),
        Setting(
            "threads",
            int,
            None,
            "CPU threads (default: all cores up to 4, else half).",
            ("--threads",),
            1,
            1024,
            optional=True,
            shown="(automatic)",
        ),
        Setting(
            "gpu_layers",
            int,
            -1,
            "Target layers to offload to the GPU (-1 = all when the build supports it).",
            ("--gpu-layers",),
            -1,
            100_000,
        ),
        Setting(
            "draft_gpu_layers",
            int,
            -1,
            "Draft layers to offload to the GPU (-1 = all when the build supports it).",
            ("--draft-gpu-layers",),
            -1,
            100_000,
        ),
        Setting(
            "flash_attn",
            bool,
            False,
            "Use llama.cpp's flash attention kernels (faster on most GPUs).",
            ("--flash-attn",),
        ),
        Setting(
            "exact",
            bool,
            False,
            "Verify drafts in batches that compute what one-token decoding computes, to the bit: the same "
            "text with or without drafting, near ties included. CPU only; needs llama-cpp-python built "
            "with CMAKE_ARGS=-DGGML_LLAMAFILE=OFF (see docs/guide.md).",
            ("--exact",),
        ),
        Setting(
            "cache_ram",
            int,
            2048,
            "Memory for the prompt cache in MiB, one budget for the process (the target's and the draft model's "
            "states, and those waiting to be written to disk): prompts seen before (an agent's instructions, a "
            "conversation) are restored instead of prefilled (0: none kept in memory).",
            ("--cache-ram",),
            0,
            1_048_576,
        ),
        Setting(
            "cache_disk",
            int,
            4096,
            "Disk for the prompt cache in MiB, under the cache directory: kept across restarts, and never filling the "
            "disk (1 GiB, or a twentieth of a smaller disk, is left free) (0: none on disk).",
            ("--cache-disk",),
            0,
            16_777_216,
        ),
        Setting(
            "recall",
            bool,
            True,
            "Draft from earlier answers, kept across restarts in the cache directory: an answer given again (a "
            "regenerated reply, an agent's repeated step) comes sooner.",
            ("--recall",),
        ),
        # the server's own (serve only)
        Setting("host", str, "127.0.0.1", "Address to listen on (0.0.0.0 for every interface).", ("--host",)),
        Setting("port", int, 8080, "Port to listen on (0: any free port).", ("--port",), 0, 65535),
        Setting(
            "max_queue",
            int,
            16,
            "Requests that may wait; beyond them, 503.",
            ("--max-queue",),
            1,
            10_000,
            in_config=False,
        ),
        Setting(
            "max_connections",
            int,
            128,
            "Open connections; beyond them, 503.",
            ("--max-connections",),
            1,
            100_000,
            in_config=False,
        ),
        Setting(
            "client_timeout",
            float,
            30.0,
            "Seconds a client may take to send its headers or body, or leave a stream unread, before it is dropped "
            "(its generation stopped).",
            ("--client-timeout",),
            0.1,
            86_400,
            in_config=False,
        ),
        Setting(
            "max_body",
            int,
            16 * 2**20,
            "Largest request body in bytes; beyond it, 413.",
            ("--max-body",),
            1024,
            2**31,
            in_config=False,
        ),
    ]
}


def checked(name: str, value: Any, setting: str | None = None) -> Any:
    """`value` as the settings table's `setting` (default: `name`) takes it; ValueError "name: why" otherwise."""
    try:
        return SETTINGS[setting or name].check(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def default(name: str, command: str | None = None) -> Any:
    """A setting's default (`command`'s own where it has one), as the table has it (the one place defaults are
    written)."""
    setting = SETTINGS[name]
    return dict(setting.per_command).get(command, setting.default) if command else setting.default


# Which config-file settings reach which command (bench keeps its own greedy sampler unless told).
MODELS = ("target", "draft")
HARDWARE = ("gpu_layers", "draft_gpu_layers", "threads", "ctx", "flash_attn")
SAMPLER = ("temperature", "top_k", "top_p", "min_p")
# The settings of a run, declared once: the options of every command that loads a pair and samples (generate, chat,
# serve), LocalSpec.load's and run_config's keywords, RunConfig's fields.
RUN = (*MODELS, "k", *SAMPLER, "seed", "ctx", "threads", "gpu_layers", "draft_gpu_layers", "flash_attn", "exact",
       "cache_ram", "cache_disk", "recall")  # fmt: skip
CONFIG_KEYS = tuple(name for name, s in SETTINGS.items() if s.in_config)
COMMANDS = {"generate": CONFIG_KEYS, "chat": CONFIG_KEYS, "serve": CONFIG_KEYS, "bench": MODELS + HARDWARE}
CHAT_SETTABLE = tuple(name for name, s in SETTINGS.items() if s.in_chat)
