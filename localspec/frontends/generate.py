"""`localspec generate`: one prompt through the engine, streamed or as one JSON result."""

from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console

from localspec.api import Generation, LocalSpec, RunConfig


def loading(what: str) -> AbstractContextManager[Any]:
    """A transient spinner on a terminal's stderr while models load; nothing when piped."""
    console = Console(stderr=True)
    return console.status(what) if console.is_terminal else nullcontext()


def run_generate(
    cfg: RunConfig,
    text: str,
    *,
    raw: bool,
    system: str | None,
    max_tokens: int,
    stops: list[str],
    stream: bool,
    started: float,
    prediction: str | None = None,
    **options: Any,
) -> tuple[dict[str, Any], str]:
    """Generate a completion of `text`, streaming to stdout when asked: (JSON record, stats line).

    `options` go to LocalSpec.generate (response_format, grammar, logprobs, suffix). load_seconds,
    time_to_first_token and total_seconds count from `started` (the process's start).
    """
    with loading("loading models…"):
        spec = LocalSpec.from_config(cfg)
    loaded = time.perf_counter()
    run = spec.generate(  # the sampler and seed: the session's, as loaded from cfg
        text,
        raw=raw,
        system=system,
        max_tokens=max_tokens,
        stop=stops,
        prediction=prediction,
        **options,
    )
    first: float | None = None
    try:
        for piece in run:
            first = first or time.perf_counter()
            if stream:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        run.stats.finish_reason = "interrupted"
    end = time.perf_counter()
    st = run.stats
    st.load_seconds, st.total_seconds = loaded - started, end - started
    st.time_to_first_token = (first or end) - started
    spec.save_costs()
    return _record(spec, run), " · ".join([st.summary(), *spec.notes])


def _record(spec: LocalSpec, run: Generation) -> dict[str, Any]:
    """The JSON result of a finished generation: its text, figures, settings, models and notes."""
    draft = spec.draft_path
    record = {
        "text": run.text,
        **run.stats.to_dict(),
        "k": "auto" if spec.k is None else spec.k,
        **dataclasses.asdict(run.sampler),  # the settings it sampled with
        "seed": run.seed,
        "target": str(spec.target_path),
        "draft": str(draft) if draft else None,
        "notes": spec.notes,
    }
    if run.logprobs is not None:
        record["logprobs"] = [
            {
                "token": spec.piece(e.token).decode("utf-8", "replace"),
                "logprob": e.logprob,
                "top_logprobs": [{"token": spec.piece(t).decode("utf-8", "replace"), "logprob": lp} for t, lp in e.top],
            }
            for e in run.logprobs
        ]
    return record
