"""The `localspec` command line (typer): generate, chat, serve, bench, models, config and doctor."""

from __future__ import annotations

import functools
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.api import RunConfig, run_config, structure_grammar
from localspec.errors import LocalspecError
from localspec.frontends.conversation import LATEST
from localspec.frontends.models import models_app
from localspec.settings import MODELS, RUN, SETTINGS, default

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Lossless speculative decoding for local GGUF models: same text, fewer target passes.",
)
app.add_typer(models_app, name="models")
config_app = typer.Typer(no_args_is_help=True, help="Show the settings from the config file and the environment.")
app.add_typer(config_app, name="config")
cache_app = typer.Typer(no_args_is_help=True, help="The prompt cache and the earlier answers: show or empty them.")
app.add_typer(cache_app, name="cache")


def _opt(name: str, kind: Any = None) -> Any:
    """The Annotated type of a setting's option, made from the settings table."""
    setting = SETTINGS[name]
    if kind is None:
        kind = str if setting.auto else setting.kind
        kind = kind | None if setting.optional else kind
    return Annotated[kind, setting.typer_option()]


def _flag(*names: str, help: str) -> Any:
    return Annotated[bool, typer.Option(*names, help=help)]


# The options of every command that loads the pair and samples (generate, chat, serve), made once from the
# settings table's run settings (settings.RUN), with the two flags that choose what drafts.
_RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    **{name: (_opt(name), SETTINGS[name].default) for name in MODELS},
    "no_draft": (_flag("--no-draft", help="Run the target alone through the same sampler (the baseline)."), False),
    "no_copier": (_flag("--no-copier", "--no-ngram", help="Draft with the draft model only: no copier."), False),
    **{name: (_opt(name), SETTINGS[name].default) for name in RUN[len(MODELS) :]},
}


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the shared model, sampler and hardware options; it receives them as `cfg: RunConfig`."""
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "cfg"]
    own_default = {name: default(name, func.__name__) for name in _RUN_OPTIONS if name in SETTINGS}
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=own_default.get(name, value), annotation=kind)
        for name, (kind, value) in _RUN_OPTIONS.items()
    ]

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        opts = {name: kwargs.pop(name) for name in _RUN_OPTIONS}
        return func(cfg=_config(opts), **kwargs)

    params = own + shared
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # typer reads the signature above, not the wrapped function's
    return command


def closed_pipe_exits_141(func: Callable[..., Any]) -> Callable[..., Any]:
    """A command writing to a pipe whose reader went away (`| head`) ends quietly with exit 141, as
    shell tools do. Caught here: click would turn it into exit 1 before main() saw it."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            raise typer.Exit(141) from None

    return command


def _option(name: str) -> Any:
    return SETTINGS[name].typer_option()


MaxTokens = Annotated[int, _option("max_tokens")]
Temperature = Annotated[float, _option("temperature")]
Target = Annotated[str | None, _option("target")]
Draft = Annotated[str, _option("draft")]
Ctx = Annotated[int, _option("ctx")]
Threads = Annotated[int | None, _option("threads")]
GpuLayers = Annotated[int, _option("gpu_layers")]
DraftGpuLayers = Annotated[int, _option("draft_gpu_layers")]
FlashAttn = Annotated[bool, _option("flash_attn")]
Stop = Annotated[
    list[str] | None,
    typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed."),
]
System = Annotated[str | None, typer.Option("--system", help="System prompt (chat template mode only).")]


def _config(opts: dict[str, Any]) -> RunConfig:
    """The RunConfig of the shared options."""
    try:
        return run_config(copier=not opts.pop("no_copier"), **opts)
    except ValueError as e:  # the options' own checks came first: only a combination is left
        raise typer.BadParameter(str(e)) from None


def _read_text(path: Path, what: str) -> str:
    """A UTF-8 text file the user named, or a one-line error."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise LocalspecError(f"{path}: the {what} is not valid UTF-8 (bad byte at offset {e.start})") from None
    except OSError as e:
        raise LocalspecError(f"cannot read the {what} {path}: {e.strerror}") from None


def _structure(json_schema: Path | None, grammar: Path | None) -> dict[str, Any]:
    """LocalSpec.generate's response_format or grammar from the files named, checked before any model loads."""
    if json_schema and grammar:
        raise LocalspecError("give --json-schema or --grammar, not both")
    if json_schema:
        try:
            schema = json.loads(_read_text(json_schema, "JSON schema"))
        except json.JSONDecodeError as e:
            raise LocalspecError(f"{json_schema}: not JSON ({e})") from None
        options: dict[str, Any] = {
            "response_format": {"type": "json_schema", "json_schema": {"name": json_schema.stem, "schema": schema}}
        }
    elif grammar:
        options = {"grammar": _read_text(grammar, "grammar")}
    else:
        return {}
    try:
        structure_grammar(options.get("response_format"), options.get("grammar"))
    except ValueError as e:
        raise LocalspecError(f"{json_schema or grammar}: {str(e).split(': ', 1)[-1]}") from None
    return options


def _read_prompt(prompt: str | None) -> str:
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise typer.BadParameter("give a PROMPT argument or pipe the prompt on standard input", param_hint="PROMPT")
        data = sys.stdin.buffer.read()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise LocalspecError(f"standard input is not valid UTF-8 (bad byte at offset {e.start})") from None
    if not prompt.strip():
        raise LocalspecError("the prompt is empty")
    return prompt


# generate's own options
Raw = Annotated[bool, typer.Option("--raw", help="Plain completion of the text, without the chat template.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object (text and stats) instead of streaming.")]
PredictionFile = Annotated[
    Path | None,
    typer.Option(
        "--prediction",
        help="A file the answer is expected to repeat (the file being rewritten, say): drafts from it "
        "make the answer come sooner; the answer itself does not change.",
    ),
]
JsonSchemaFile = Annotated[
    Path | None,
    typer.Option(
        "--json-schema",
        help="A JSON Schema file: the answer is JSON that validates against it (its fixed parts are drafted).",
    ),
]
GrammarFile = Annotated[
    Path | None, typer.Option("--grammar", help="A GBNF (llama.cpp's) or Lark grammar file the answer follows.")
]
Logprobs = Annotated[
    int | None,
    typer.Option(
        "--logprobs", min=0, max=20, help="With --json: each token's log-probability and this many alternatives."
    ),
]
Suffix = Annotated[
    str | None,
    typer.Option("--suffix", help="Fill in the middle: the text that follows the answer (the prompt precedes it)."),
]


@app.command()
@closed_pipe_exits_141
@run_options
def generate(
    cfg: RunConfig,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; read from standard input when omitted.")] = None,
    max_tokens: MaxTokens = default("max_tokens"),
    stop: Stop = None,
    system: System = None,
    raw: Raw = False,
    as_json: AsJson = False,
    prediction: PredictionFile = None,
    json_schema: JsonSchemaFile = None,
    grammar: GrammarFile = None,
    logprobs: Logprobs = None,
    suffix: Suffix = None,
) -> None:
    """Complete one prompt, streaming text to stdout and a stats line to stderr."""
    from localspec.frontends.generate import run_generate
    from localspec.process import started as process_started

    started = process_started()
    text = _read_prompt(prompt)
    predicted = _read_text(prediction, "prediction") if prediction else None
    structure = _structure(json_schema, grammar)
    result, summary = run_generate(
        cfg,
        text,
        raw=raw,
        system=system,
        max_tokens=max_tokens,
        stops=stop or [],
        stream=not as_json,
        started=started,
        prediction=predicted,
        logprobs=logprobs,
        suffix=suffix,
        **structure,
    )
    if as_json:
        print(json.dumps(result))
    else:
        print(file=sys.stdout, flush=True)
        print(f"localspec: {summary}", file=sys.stderr)
    if result["finish_reason"] == "interrupted":
        raise typer.Exit(130)


@app.command()
@run_options
def chat(
    cfg: RunConfig,
    max_tokens: MaxTokens = default("max_tokens", "chat"),
    system: System = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="[NAME]",
            help="Continue a saved conversation: the newest, or NAME (/sessions lists them). Each chat saves "
            "its own after every turn.",
        ),
    ] = None,
) -> None:
    """Chat in the terminal, with speculative decoding underneath (/help lists the commands)."""
    from localspec.api import LocalSpec
    from localspec.frontends.chat import Repl
    from localspec.frontends.conversation import Conversation, Session, find_session
    from localspec.frontends.generate import loading
    from localspec.paths import data_dir

    source = find_session(resume) if resume is not None else None  # before the models load: nothing to wait for
    with loading("loading models…"):
        spec = LocalSpec.from_config(replace(cfg, session=True))  # many answers: the draft model's horizon
    for note in spec.notes:
        print(f"localspec: {note}", file=sys.stderr)
    conv = Conversation(spec, system=system, max_tokens=max_tokens)
    if source is not None:
        conv.load(source)
        print(f"resumed {len(conv.messages)} messages from {source}", file=sys.stderr)
    else:
        conv.prefill()
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):  # a closed terminal, a stopped service
        if sig is not None:
            signal.signal(sig, _stopped)
    session = Session()
    if source is not None and (forked := session.continue_with(source)):  # one another chat has open is forked
        print(f"localspec: {forked}", file=sys.stderr)
    try:
        Repl(conv, history=data_dir() / "history", autosave=session).run()
    finally:  # however it ends, the conversation and what was learned of the machine are kept
        if conv.messages:
            try:
                conv.save(session.path)
            except LocalspecError as e:
                print(f"localspec: {e}", file=sys.stderr)
        session.release()
        spec.save_costs()


def _stopped(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP in a chat: leave as Ctrl-D does, saving first."""
    raise SystemExit(128 + signum)


@app.command()
@run_options
def serve(
    cfg: RunConfig,
    host: Annotated[str, _option("host")] = default("host"),
    port: Annotated[int, _option("port")] = default("port"),
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="LOCALSPEC_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on every /v1 request.",
        ),
    ] = None,
    model_alias: Annotated[
        str | None, typer.Option("--model-alias", help="The model id clients use (default: the target's name).")
    ] = None,
    max_queue: Annotated[int, _option("max_queue")] = default("max_queue"),
    log_prompts: Annotated[bool, typer.Option("--log-prompts", help="Put prompt text in the access log.")] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Also answer to this Host name (repeatable; '*' for any). Default: loopback names and --host.",
        ),
    ] = None,
    cors: Annotated[
        list[str] | None,
        typer.Option("--cors", help="Let web pages of this origin call the API from a browser (repeatable)."),
    ] = None,
    max_body: Annotated[int, _option("max_body")] = default("max_body"),
    client_timeout: Annotated[float, _option("client_timeout")] = default("client_timeout"),
    max_connections: Annotated[int, _option("max_connections")] = default("max_connections"),
) -> None:
    """Serve an OpenAI-compatible API (chat and text completions, responses, streaming, Predicted Outputs)."""
    from localspec.frontends.server.run import serve_forever
    from localspec.frontends.server.settings import ServerSettings

    settings = ServerSettings(
        host=host,
        port=port,
        api_key=api_key,
        model_alias=model_alias,
        log_prompts=log_prompts,
        allow_host=tuple(allow_host or ()),
        cors=tuple(cors or ()),
        max_queue=max_queue,
        max_connections=max_connections,
        client_timeout=client_timeout,
        max_body=max_body,
    )
    serve_forever(cfg, settings)


# bench's own options
BenchPrompts = Annotated[
    Path | None,
    typer.Option(
        "--prompts",
        help='JSONL file of {"prompt": ..., "task": ..., optional "response_format": OpenAI\'s} (default: the built-in set: code edits, summaries, chats, short prompts, writing code, JSON under a schema).',
    ),
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the raw figures to this JSON file.")]
PlotOut = Annotated[
    Path | None, typer.Option("--plot", help="Draw tok/s and acceptance per strategy and task to this PNG.")
]
Strategies = Annotated[
    str | None,
    typer.Option(
        "--strategies",
        help="Comma-separated strategies to run (default: all): target-only, 'draft_model k=2', 'draft_model k=4', 'draft_model k=8', 'copier k=32', auto. The target alone always runs: it is the baseline.",
    ),
]
BenchSeed = Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="Random seed of every run.")]
Repeat = Annotated[
    int,
    typer.Option("--repeat", min=1, max=100, help="Rounds per prompt, in rotated order and summed (steadier figures)."),
]
NoLookup = Annotated[bool, typer.Option("--no-lookup", help="Skip the llama-cpp-python prompt-lookup reference row.")]
Requantize = Annotated[
    str | None,
    typer.Option(
        "--requantize",
        help="Bench the target requantized to Q8_0, F16 or Q6_K (made once beside it, about 20 s, no download): a memory-bound target, where a draft model wins on a CPU.",
    ),
]


@app.command()
def bench(
    prompts: BenchPrompts = None,
    json_out: JsonOut = None,
    plot_out: PlotOut = None,
    strategies: Strategies = None,
    max_tokens: MaxTokens = 400,
    temperature: Temperature = 0.0,
    seed: BenchSeed = 0,
    repeat: Repeat = 1,
    no_lookup: NoLookup = False,
    requantize: Requantize = None,
    target: Target = default("target"),
    draft: Draft = default("draft"),
    ctx: Ctx = default("ctx"),
    threads: Threads = default("threads"),
    gpu_layers: GpuLayers = default("gpu_layers"),
    draft_gpu_layers: DraftGpuLayers = default("draft_gpu_layers"),
    flash_attn: FlashAttn = default("flash_attn"),
) -> None:
    """Run every strategy on the same prompts as `localspec generate` would, and compare what the user waits for.

    Each run loads its models afresh and reports load, prefill, time to first token, decode and total
    time. Every run is timed against a clock: target-only decoding on a second copy of the target
    (loaded for the bench), run in turns alongside it, so speedups hold on a machine whose speed drifts.
    """
    from localspec.frontends.bench import bench_command

    bench_command(
        prompts=prompts,
        json_out=json_out,
        plot_out=plot_out,
        strategies=strategies,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        repeat=repeat,
        lookup=not no_lookup,
        requantize=requantize,
        target=target,
        draft=draft,
        ctx=ctx,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        flash_attn=flash_attn,
    )


@app.command()
def doctor(
    seconds: Annotated[
        float, typer.Option("--seconds", min=0.5, max=60, help="Length of each model's speed test.")
    ] = 3.0,
    threads: Threads = default("threads"),
    recalibrate: Annotated[
        bool,
        typer.Option(
            "--recalibrate", help="Measure the default pair's decode costs afresh and replace the learned ones."
        ),
    ] = False,
) -> None:
    """Check this machine: the llama.cpp build, the models here, the default pair, and their speed."""
    from localspec.frontends.doctor import run_doctor

    run_doctor(seconds=seconds, threads=threads, recalibrate=recalibrate)


@cache_app.command("show")
def cache_show() -> None:
    """What the prompt cache and the earlier answers hold on disk, and their budgets."""
    from localspec.machine import cache_report

    print(cache_report())


@cache_app.command("clear")
def cache_clear() -> None:
    """Empty the prompt cache and forget the earlier answers (the measured costs stay)."""
    from localspec.machine import clear_caches

    print(f"freed {clear_caches() / 2**20:.1f} MiB")


@config_app.command("show")
def config_show() -> None:
    """The effective default of every setting and where it comes from (flags override all of them)."""
    from localspec.config import config_path, effective

    path = config_path()
    print(f"config file: {path}{'' if path.exists() else ' (none)'}")
    for key, value, source in effective():
        print(f"{key:17} {value!s:40} {source}")


def _resume_alone(args: list[str]) -> list[str]:
    """`chat --resume` with no NAME after it (at the end, or before another option) means the newest."""
    if not args or args[0] != "chat":
        return args
    return [
        a
        for i, arg in enumerate(args)
        for a in ([arg, LATEST] if arg == "--resume" and (i + 1 == len(args) or args[i + 1].startswith("-")) else [arg])
    ]


def main() -> None:
    """Entry point: one-line errors with exit 2, 130 on Ctrl-C, quiet on a closed pipe."""
    from localspec.config import default_map, load_config

    command = typer.main.get_command(app)
    try:
        try:
            defaults = default_map(load_config())
        except LocalspecError as e:  # help still shows, with the reason the config is not read
            if "--help" not in sys.argv[1:] and len(sys.argv) > 1:
                raise
            print(f"localspec: warning: {e}; its settings are not used", file=sys.stderr)
            defaults = {}
        args = _resume_alone(sys.argv[1:])
        code = command.main(args, prog_name="localspec", standalone_mode=False, default_map=defaults)
    except typer.Abort:
        code = 130
    except typer.TyperException as e:  # usage errors, bad parameter values (typer's own click)
        e.show()  # type: ignore[attr-defined]
        code = e.exit_code
    except LocalspecError as e:
        print(f"localspec: error: {e}", file=sys.stderr)
        code = 2
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        print(
            f"localspec: internal error: {type(e).__name__}: {e} (LOCALSPEC_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        code = 1
    if (prompts := sys.modules.get("localspec.llama.prompts")) is not None:
        prompts.flush_all()  # the prompt cache's entries being written, whole before the process ends
    if code == 141:  # stdout is gone: make the final flush harmless
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)
