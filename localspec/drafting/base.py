"""The drafter protocol: one small interface every draft source implements.

A drafter proposes tokens for the target to verify. The planner asks each drafter how long what it
would propose now is likely to hold (`survival`) and what that costs (`token_seconds`,
`setup_seconds`), prices every option with the measured verify costs, and asks the winner to
`draft`. After the target's verdict every drafter `observe`s the round. The speculative loop knows
no more than this: adding a draft source means writing one subclass and registering it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.costs import CostModel

if TYPE_CHECKING:
    from localspec.llama.model import Model


class Drafter(ABC):
    """A source of draft tokens (see the module docstring for the protocol)."""

    name: ClassVar[str] = "drafter"
    max_k: ClassVar[int] = 64  # the longest proposal the planner asks of it
    # whether what it proposes is certain but for spelling (a grammar's forced tokens): then the planner takes
    # all of it, as a certain token costs less in any batch than in a round of its own later
    certain: ClassVar[bool] = False
    # whether it learns from the target's confidence (observe's `confidence`, computed only where a drafter is)
    confident: ClassVar[bool] = False

    def start(self, prompt_len: int, *, fill: bool = False) -> None:
        """A new generation begins; its output follows the first prompt_len tokens of the context. With `fill`
        it fills a gap in that context (fill-in-the-middle): new text beside it, not a rewrite of it."""

    def reset(self) -> None:
        """Forget the context (a new conversation); what was learned about the text may stay."""

    @abstractmethod
    def survival(self, ctx: list[int], k_max: int) -> list[float]:
        """S_1..S_n (n <= k_max): the estimated probability that the first j tokens it would propose all
        hold. Empty when it has nothing to propose now."""

    def token_seconds(self, cost: CostModel) -> float:
        """Seconds it spends per proposed token (0 for a copy)."""
        return 0.0

    def setup_seconds(self, ctx: list[int], cost: CostModel) -> float:
        """One-off seconds before it can propose for ctx (a draft model catching up on the context)."""
        return 0.0

    def horizon(self, ctx: list[int], room: int) -> int:
        """The tokens its setup is amortized over: those likely to come, at most `room` (the default)."""
        return room

    def probe(self, ctx: list[int], room: int, cost: CostModel) -> int:
        """Under automatic k, when nothing else wins: a short draft worth trying to refresh stale
        estimates (0: none)."""
        return 0

    @abstractmethod
    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        """Propose exactly k tokens to follow ctx (k never exceeds what survival offered, or max_k). A drafter
        that samples picks with `sampling` at the positions its tokens take (the target's own noise)."""

    def observe(
        self, ctx: list[int], by: Drafter | None, drafted: int, accepted: int, confidence: Sequence[float] = ()
    ) -> None:
        """Learn from a finished round: ctx ends with the tokens it emitted, the `accepted` of `drafted`
        draft tokens first; `by` is the drafter that made the round's draft (None: the target alone).
        `confidence`: the target's top probability at each emitted position it computed (for `confident`
        drafters)."""

    def rewind(self, n: int) -> None:
        """The context now holds only its first n tokens (after verification): drop any state past it."""

    @property
    def seconds(self) -> float:
        """Seconds spent computing drafts so far (for overhead accounting)."""
        return 0.0


DrafterFactory = Callable[["Model"], Drafter]  # the target model -> a drafter for it
REGISTRY: dict[str, DrafterFactory] = {}


def register(name: str, factory: DrafterFactory) -> None:
    """Make a drafter available by name (LocalSpec.load(drafters=[name]), RunConfig.drafters)."""
    REGISTRY[name] = factory
