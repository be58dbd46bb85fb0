"""The prompt cache and earlier answers as a new user meets them: `localspec serve`, the official openai client.

    python scripts/prompt_cache.py [--ctx 8192] [--system-tokens 1800] [--max-tokens 64] [-- extra serve flags]

In a fresh cache directory: conversation A's first turn, conversation B's first turn, A's second turn; the
server restarted, A's second turn again (what a client resuming after a restart sends); then a 300-token code
answer asked for in a new conversation, and asked for again in another. Prints each request's time, its
prompt and cached tokens, and the ratios the prompt cache is judged by (A's second turn against A's first; the
code answer's decode speed the second time against the first). `--no-cache` runs the same with the cache and
recall off (cache_ram 0, cache_disk 0, --no-recall): the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import openai

sys.path.insert(0, os.path.dirname(__file__))
from stall_check import serve

CODE = "Write a Python class for an LRU cache with get, put, a capacity and a docstring for each method. Code only."


def system_prompt(tokens: int, topic: str) -> str:
    """About `tokens` tokens of an agent's standing instructions (about 15 tokens a rule)."""
    rules = [
        f"Rule {i} on {topic}: keep changes small, name things clearly, test what you touch." for i in range(1, 9999)
    ]
    return f"You are a coding agent working on {topic}. " + " ".join(rules[: max(1, tokens // 17)])


class Server:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc, url = serve(*args, env=env)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=3600)
        self.model = self.client.models.list().data[0].id

    def ask(self, messages: list[Any], max_tokens: int) -> tuple[dict[str, Any], str]:
        t0 = time.perf_counter()
        first: float | None = None
        text, usage = [], None
        stream = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                text.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        end = time.perf_counter()
        assert usage is not None
        details = usage.prompt_tokens_details
        n = usage.completion_tokens
        row = {
            "seconds": end - t0,
            "first_token": (first or end) - t0,
            "decode_tok_s": (n - 1) / (end - first) if first and n > 1 and end > first else None,
            "prompt": usage.prompt_tokens,
            "cached": details.cached_tokens if details else 0,
            "completion": n,
        }
        return row, "".join(text)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--system-tokens", type=int, default=1800)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--code-tokens", type=int, default=300)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("serve_args", nargs="*")
    opts = parser.parse_args()
    env = {**os.environ, "LOCALSPEC_CACHE_DIR": tempfile.mkdtemp(prefix="localspec-prompts-")}
    flags = ["--ctx", str(opts.ctx), *opts.serve_args]
    if opts.no_cache:
        flags += ["--cache-ram", "0", "--cache-disk", "0", "--no-recall"]
    a = [{"role": "system", "content": system_prompt(opts.system_tokens, "a billing service")}]
    b = [{"role": "system", "content": system_prompt(opts.system_tokens, "a search engine")}]
    a1 = [*a, {"role": "user", "content": "Which tests should a change to the invoice totals come with?"}]
    b1 = [*b, {"role": "user", "content": "How should the ranking code be split into modules?"}]
    rows: dict[str, dict[str, Any]] = {}
    server = Server(flags, env)
    rows["A, turn 1"], answer = server.ask(a1, opts.max_tokens)
    rows["B, turn 1"], _ = server.ask(b1, opts.max_tokens)
    a2 = [*a1, {"role": "assistant", "content": answer}, {"role": "user", "content": "Write the first of them."}]
    rows["A, turn 2 (after B)"], _ = server.ask(a2, opts.max_tokens)
    server.stop()
    server = Server(flags, env)
    rows["A, turn 2 (after a restart)"], _ = server.ask(a2, opts.max_tokens)
    code = [{"role": "user", "content": CODE}]
    rows["code answer"], _ = server.ask(code, opts.code_tokens)
    rows["code answer again"], _ = server.ask(code, opts.code_tokens)
    server.stop()
    print(f"{'request':<30} {'seconds':>8} {'first':>7} {'tok/s':>6} {'prompt':>7} {'cached':>7}")
    for name, r in rows.items():
        speed = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-"
        print(f"{name:<30} {r['seconds']:8.2f} {r['first_token']:7.2f} {speed:>6} {r['prompt']:7d} {r['cached']:7d}")
    first = rows["A, turn 1"]["seconds"]
    for name in ("A, turn 2 (after B)", "A, turn 2 (after a restart)"):
        r = rows[name]
        print(f"{name}: {r['seconds'] / first:.2f}x A's first turn, cached {r['cached'] / r['prompt']:.0%}")
    one, two = rows["code answer"]["decode_tok_s"], rows["code answer again"]["decode_tok_s"]
    if one and two:
        print(f"code answer again: decodes {two / one:.2f}x as fast as the first time")


if __name__ == "__main__":
    main()
