"""Codex CLI's first turn, cold and after a server restart, against `localspec serve` with the prompt cache.

    npm install --prefix /tmp/codex @openai/codex
    python scripts/codex_turns.py /tmp/codex/node_modules/.bin/codex [--ctx 16384] [-- extra serve flags]

In a fresh cache directory: a new `codex exec` (Codex's own instructions and tools, about 8,700 tokens), the
server restarted, then another new `codex exec` with another question. Prints, for each of the server's
requests, what its access log says (prompt and completion tokens, first token, cached share), and each exec's
wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from stall_check import serve

MODEL = "qwen2.5-coder-1.5b-instruct"
QUESTIONS = ("What is 2+2? Answer with the number only.", "What is the capital of France? One word.")


def codex_exec(codex: str, home: Path, url: str, question: str, workdir: Path) -> float:
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "localspec"\n[model_providers.localspec]\nname = "localspec"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")} | {"CODEX_HOME": str(home)}
    t0 = time.perf_counter()
    subprocess.run(
        [codex, "exec", "--json", "--skip-git-repo-check", question],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=1800,
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("codex")
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("serve_args", nargs="*")
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="localspec-codex-"))
    env = {**os.environ, "LOCALSPEC_CACHE_DIR": str(root / "cache")}
    flags = ["--ctx", str(opts.ctx), "--temperature", "0", *opts.serve_args]
    log, home, work = root / "serve.log", root / "codex-home", root / "work"
    home.mkdir()
    work.mkdir()
    walls = []
    for question in QUESTIONS:  # each in a server of its own: the second after a restart
        proc, url = serve(*flags, env=env, log=log)
        walls.append(codex_exec(opts.codex, home, url, question, work))
        proc.terminate()
        proc.wait(timeout=300)
    pattern = re.compile(r"POST /v1/responses 200 (\d+)\+(\d+) tokens(?: \((\d+) cached\))?, first token ([\d.]+) s")
    for line in log.read_text().splitlines():
        if m := pattern.search(line):
            print(f"prompt {m[1]} tokens ({m[3] or '?'} cached), answer {m[2]}, first token {m[4]} s")
    for question, wall in zip(QUESTIONS, walls, strict=True):
        print(f"codex exec {question!r}: {wall:.1f} s")


if __name__ == "__main__":
    main()
