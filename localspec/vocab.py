"""Whether a draft can draft for a target: their vocabularies, compared from the GGUF headers."""

from __future__ import annotations

from pathlib import Path

from localspec.gguf import read_gguf


def _tokens(path: Path) -> list[str]:
    return read_gguf(path, tokens=True).tokens or []


def mismatch(target: Path, draft: Path) -> str | None:
    """None when the two GGUF files have the same vocabulary, else what differs (first differing token).

    Speculative sampling compares p and q token by token, so every draft token id must mean the
    same text in the target. The target may have extra tokens after the draft's last one (Qwen2.5
    7B and up pad 151,936 to 152,064): the draft gives them probability 0, which stays exact.
    """
    t, d = _tokens(target), _tokens(draft)
    first = next((i for i, (a, b) in enumerate(zip(t, d)) if a != b), None)
    problems = []
    if len(d) > len(t):
        problems.append(f"the draft's vocabulary is larger than the target's ({len(d):,} vs {len(t):,} tokens)")
    elif len(d) < len(t) and first is not None:
        problems.append(f"vocabulary sizes differ (target {len(t):,}, draft {len(d):,})")
    if first is not None:
        problems.append(f"first differing token is id {first}: target {t[first]!r}, draft {d[first]!r}")
    return "; ".join(problems) or None
