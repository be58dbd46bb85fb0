"""`localspec generate`: one prompt through the engine, streamed or as one JSON result."""

from __future__ import annotations

import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console

from localspec import STARTED_AT
from localspec.drafting.calibration import save_costs
from localspec.llama.template import chat_tokens, raw_tokens
from localspec.runtime import RunConfig, draft_model_of, load_engine


def loading(what: str) -> AbstractContextManager[Any]:
    """A transient spinner on a terminal's stderr while models load; nothing when piped."""
    console = Console(stderr=True)
    return console.status(what) if console.is_terminal else nullcontext()


def run_generate(cfg: RunConfig, text: str, *, raw: bool, system: str | None, max_tokens: int,
                 stops: list[str], stream: bool) -> tuple[dict[str, Any], str]:
    """Generate a completion of `text`, streaming to stdout when asked: (JSON record, stats line).

    load_seconds, time_to_first_token and total_seconds count from the process's start.
    """
    with loading("loading models…"):
        engine = load_engine(cfg)
    loaded = time.perf_counter()
    if raw:
        prompt = raw_tokens(engine.target, text)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        prompt = chat_tokens(engine.target, messages)
    out: list[str] = []
    first: float | None = None
    try:
        for piece in engine.generate(prompt, max_tokens, stops):
            first = first or time.perf_counter()
            out.append(piece.text)
            if stream:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        engine.stats.finish_reason = "interrupted"
    end = time.perf_counter()
    st = engine.stats
    st.load_seconds, st.total_seconds = loaded - STARTED_AT, end - STARTED_AT
    st.time_to_first_token = (first or end) - STARTED_AT
    if engine.cost is not None:
        save_costs(engine.target, draft_model_of(engine), engine.cost)
    s = cfg.sampler
    record = {"text": "".join(out), **st.to_dict(), "k": "auto" if engine.k is None else engine.k,
              "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "seed": cfg.seed,
              "target": str(engine.target.path),
              "draft": str(draft_model_of(engine).path) if draft_model_of(engine) else None, "notes": engine.notes}
    return record, " · ".join([st.summary(), *engine.notes])
