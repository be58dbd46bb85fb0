"""What one generation measured: tokens, passes, drafts, and where the time went."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from difflib import SequenceMatcher
from typing import Any

_SUMMED = (
    "prompt_tokens",
    "prefill_tokens",
    "completion_tokens",
    "target_passes",
    "drafted",
    "accepted",
    "prefill_seconds",
    "wall_seconds",
    "target_seconds",
    "draft_seconds",
)


@dataclass
class Stats:
    """Counters of one generation (decode time, wall_seconds, excludes prefill).

    load_seconds, time_to_first_token and total_seconds count from the command's start (the frontend
    fills them in); first_token_seconds counts from the start of the generation (prefill included).
    """

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually decoded (the rest was already cached)
    completion_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    target_seconds: float = 0.0  # inside llama_decode during decoding: the target ...
    draft_seconds: float = 0.0  # ... and the draft model (the rest of wall_seconds is the host's: host_seconds)
    drafted_by: dict[str, int] = field(default_factory=dict)  # drafted tokens by drafter name ...
    accepted_by: dict[str, int] = field(default_factory=dict)  # ... and those the target accepted
    first_drafts: dict[str, int] = field(default_factory=dict)  # the completion token each drafter first drafted at
    draft_load_beside: float | None = None  # where the draft model joined: what its load cost the target, seconds
    first_token_seconds: float | None = None
    load_seconds: float | None = None
    time_to_first_token: float | None = None
    total_seconds: float | None = None
    finish_reason: str = "length"
    stop_sequence: str | None = None  # the stop string the answer ended at (None: it ended otherwise)
    cache_miss: str | None = None  # why the prompt reused less than the caches held (None: it reused all it could)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.completion_tokens / self.target_passes if self.target_passes else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.completion_tokens / self.wall_seconds if self.wall_seconds > 0 else None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not decoded: the cache held them (the live one, or a prompt cache's entry)."""
        return max(self.prompt_tokens - self.prefill_tokens, 0)

    @property
    def host_seconds(self) -> float:
        """Decode time spent outside both models' llama_decode: sampling, drafting's bookkeeping, text (Python)."""
        return max(self.wall_seconds - self.target_seconds - self.draft_seconds, 0.0)

    @property
    def host_per_token(self) -> float | None:
        return self.host_seconds / self.completion_tokens if self.completion_tokens else None

    @property
    def host_per_round(self) -> float | None:
        return self.host_seconds / self.target_passes if self.target_passes else None

    def count_round(self, drafter: str | None, drafted: int, accepted: int) -> None:
        """Count one target pass that verified `drafted` tokens of `drafter`'s, `accepted` of them kept."""
        self.target_passes, self.drafted, self.accepted = (
            self.target_passes + 1,
            self.drafted + drafted,
            self.accepted + accepted,
        )
        if drafter is not None:
            if drafted:
                self.first_drafts.setdefault(drafter, self.completion_tokens)
            self.drafted_by[drafter] = self.drafted_by.get(drafter, 0) + drafted
            self.accepted_by[drafter] = self.accepted_by.get(drafter, 0) + accepted

    def add(self, other: Stats) -> None:
        """Accumulate another generation's counters (session totals)."""
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.drafted_by, other.drafted_by), (self.accepted_by, other.accepted_by)):
            for drafter, n in theirs.items():
                mine[drafter] = mine.get(drafter, 0) + n

    def summary(self) -> str:
        """One human line: tokens, tok/s, acceptance, tokens per pass, prefill, and the times waited."""
        parts = [f"{self.completion_tokens} tokens in {self.wall_seconds:.2f} s"]
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:.1f} tok/s")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})")
        if self.drafted and self.tokens_per_pass:  # plain decoding is one token a pass by definition
            parts.append(f"{self.tokens_per_pass:.2f} tokens/pass")
        if self.host_per_token is not None and self.target_seconds:
            parts.append(f"host {self.host_per_token * 1e3:.2f} ms/token")
        parts.append(f"prefill {self.prefill_tokens} tokens in {self.prefill_seconds:.2f} s")
        if self.cached_tokens:
            parts.append(f"{self.cached_tokens} cached")
        if self.draft_load_beside is not None:
            joined = self.first_drafts.get("draft_model")
            at = f"drafting from token {joined}" if joined is not None else "loaded"
            parts.append(f"draft model {at} (its load cost the target {self.draft_load_beside:.2f} s)")
        if self.load_seconds is not None:
            parts.append(f"load {self.load_seconds:.2f} s")
        first = self.time_to_first_token if self.time_to_first_token is not None else self.first_token_seconds
        if first is not None:
            parts.append(f"first token at {first:.2f} s")
        if self.total_seconds is not None:
            parts.append(f"total {self.total_seconds:.2f} s")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_pass": self.tokens_per_pass,
            "tokens_per_second": self.tokens_per_second,
            "cached_tokens": self.cached_tokens,
            "host_seconds": self.host_seconds,
            "host_seconds_per_token": self.host_per_token,
            "host_seconds_per_round": self.host_per_round,
        }


@dataclass(frozen=True)
class Piece:
    """Text of one emitted token; drafted says it was a draft token the target accepted."""

    text: str
    drafted: bool


def prediction_usage(prediction: Sequence[int], completion: Sequence[int]) -> tuple[int, int]:
    """(accepted, rejected) prediction tokens as OpenAI counts them: the prediction's tokens that appear in
    the completion (in order, its longest matching blocks), and the rest of the prediction."""
    matcher = SequenceMatcher(None, list(prediction), list(completion), autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(prediction) - accepted
