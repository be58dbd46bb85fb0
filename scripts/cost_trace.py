"""Record how localspec's learned decode costs move over runs, some of them beside busy loops.

    LOCALSPEC_CACHE_DIR=/tmp/trace-cache python scripts/cost_trace.py QBBBBBQQ scripts/cost-trace.json

Each letter is one run of the default pair, as `localspec generate` makes it: the costs loaded from
costs.json, one sampled answer of 120 tokens, the learned costs saved. In a B run two busy loops hold the
cores (`sh -c 'while :; do :; done'`); a Q run is quiet. Every target decode and draft token the cost model
observes is recorded, with the costs.json entry after the first run as "calibrated": the fixture that
tests/unit/test_costs.py replays through the cost model's load-learn-save cycle. Use an empty cache directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from localspec.api import LocalSpec
from localspec.drafting import costs
from localspec.paths import cache_dir

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain what a mutex is in two short paragraphs.",
]


def main(plan: str, out: Path) -> None:
    events: list[list[object]] = []
    observe_verify, observe_draft = costs.CostModel.observe_verify, costs.CostModel.observe_draft

    def verify(self: costs.CostModel, n: int, seconds: float) -> None:
        events.append(["v", n, round(seconds, 6)])
        observe_verify(self, n, seconds)

    def draft(self: costs.CostModel, seconds: float) -> None:
        events.append(["d", round(seconds, 6)])
        observe_draft(self, seconds)

    costs.CostModel.observe_verify, costs.CostModel.observe_draft = verify, draft  # type: ignore[method-assign,assignment]
    sessions, calibrated = [], None
    for i, kind in enumerate(plan):
        busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)] if kind == "B" else []
        try:
            events.clear()
            t0 = time.perf_counter()
            spec = LocalSpec.load()
            run = spec.generate(PROMPTS[i % 2], temperature=0.8, max_tokens=120, seed=i)
            run.result()
            spec.save_costs()
            loaded = any(d.name == "draft_model" for d in spec.engine.drafters)
            print(f"{kind} {i}: {time.perf_counter() - t0:.1f} s, draft model loaded: {loaded}", flush=True)
            entry = next(iter(json.loads((cache_dir() / "costs.json").read_text()).values()))
            if calibrated is None:
                calibrated = {
                    "verify": entry["verify"],
                    "draft": next(iter(entry["draft"].values())),
                    "draft_prefill": next(iter(entry["draft_prefill"].values())),
                }
            else:
                sessions.append({"kind": kind, "events": list(events)})
            del spec, run
        finally:
            for p in busy:
                p.kill()
    out.write_text(json.dumps({"about": __doc__.split("\n\n")[0], "calibrated": calibrated, "sessions": sessions}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
