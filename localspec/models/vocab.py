"""Whether a draft can draft for a target: their vocabularies, compared from the GGUF headers."""

from __future__ import annotations

from pathlib import Path

from localspec.files import read_json, update_json
from localspec.models.gguf import GGUFInfo, read_gguf
from localspec.paths import cache_dir


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def mismatch(target: Path, draft: Path) -> str | None:
    """mismatch_uncached, remembered per pair of files (in the cache directory) once both are valid."""
    try:
        key = f"{_file_key(target)} <- {_file_key(draft)}"
    except OSError:
        return mismatch_uncached(target, draft)  # the header check names the problem
    store = cache_dir() / "vocab-checks.json"
    known = read_json(store).get(key, False)
    if known is None or isinstance(known, str):
        return known
    verdict = mismatch_uncached(target, draft)
    update_json(store, lambda checks: checks.__setitem__(key, verdict))
    return verdict


def mismatch_uncached(target: Path, draft: Path) -> str | None:
    """None when the two GGUF files have the same vocabulary, else what differs (first differing token).

    Speculative sampling compares p and q token by token, so every draft token id must mean the
    same text in the target. The target may have extra tokens after the draft's last one (Qwen2.5
    7B and up pad 151,936 to 152,064): the draft gives them probability 0, which stays exact.
    """
    t_raw, d_raw = read_gguf(target, tokens=True).tokens_raw or b"", read_gguf(draft, tokens=True).tokens_raw or b""
    if t_raw.startswith(d_raw) and d_raw:  # the same tokens, the target's padding after them at most
        return None
    t, d = _token_texts(t_raw), _token_texts(d_raw)
    first = next((i for i, (a, b) in enumerate(zip(t, d, strict=False)) if a != b), None)
    problems = []
    if len(d) > len(t):
        problems.append(f"the draft's vocabulary is larger than the target's ({len(d):,} vs {len(t):,} tokens)")
    elif len(d) < len(t) and first is not None:
        problems.append(f"vocabulary sizes differ (target {len(t):,}, draft {len(d):,})")
    if first is not None:
        problems.append(f"first differing token is id {first}: target {t[first]!r}, draft {d[first]!r}")
    return "; ".join(problems) or None


def _token_texts(raw: bytes) -> list[str]:
    return GGUFInfo(3, tokens_raw=raw).tokens or []
