"""`localspec generate`: one prompt through the engine, streamed or as one JSON result."""

from __future__ import annotations

import sys
from contextlib import nullcontext

from rich.console import Console

from localspec.costs import save_costs
from localspec.prompt import chat_tokens, raw_tokens
from localspec.runtime import RunConfig, load_engine


def loading(what: str):
    """A transient spinner on a terminal's stderr while models load; nothing when piped."""
    console = Console(stderr=True)
    return console.status(what) if console.is_terminal else nullcontext()


def run_generate(cfg: RunConfig, text: str, *, raw: bool, system: str | None, max_tokens: int,
                 stops: list[str], stream: bool) -> tuple[dict, str]:
    """Generate a completion of `text`, streaming to stdout when asked: (JSON record, stats line)."""
    with loading("loading models…"):
        engine = load_engine(cfg)
    if raw:
        prompt = raw_tokens(engine.target, text)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        prompt = chat_tokens(engine.target, messages)
    out: list[str] = []
    try:
        for piece in engine.generate(prompt, max_tokens, stops):
            out.append(piece.text)
            if stream:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        engine.stats.finish_reason = "interrupted"
    if engine.cost is not None:
        save_costs(engine.target, engine.draft, engine.cost)
    s = cfg.sampler
    return {"text": "".join(out), **engine.stats.to_dict(), "k": "auto" if engine.k is None else engine.k, "temperature": s.temperature,
            "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "seed": cfg.seed,
            "target": str(engine.target.path),
            "draft": str(engine.draft.path) if engine.draft else None}, engine.stats.summary()
