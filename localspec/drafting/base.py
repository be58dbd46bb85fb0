"""The drafter protocol: one small interface every draft source implements.

A drafter proposes tokens for the target to verify. Each round the planner asks every drafter for its
`offer`: how long what it would propose now is likely to hold, and what that costs (per token, once, and over
how many tokens a one-off cost is spread). It prices every offer with the measured verify costs and asks the
winner to `draft`. After the target's verdict every drafter hears it (`accept`). `begin`, `end` and `reset` mark
a generation's start and end and a new conversation. The speculative loop knows no more than this: adding a draft source
means writing one subclass and registering it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from localspec.core.meter import Times
from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.drafting.costs import CostModel, amortized, best_k

if TYPE_CHECKING:
    from localspec.llama.model import Model


@dataclass(frozen=True)
class Offer:
    """What a drafter would propose now, for the planner to price.

    `survival`: S_1..S_n, the estimated probability that the first j tokens it would propose all hold (empty:
    nothing to propose). `token_seconds`: what it spends per proposed token (0 for a copy); `setup_seconds`:
    one-off seconds before it can propose (a draft model loading, catching up on the context); `horizon`: the
    tokens that setup is spread over (None: the room left; 0: it may not set up now). `probe`: under automatic
    k, the length of a probe, the one meaning of the word here: a short draft the planner takes when no offer
    wins, whatever its price, to measure what its estimates lack (a trial of a draft model, a recheck of a losing
    one, the batch probe's sizes; 0: none).
    """

    survival: Sequence[float] = ()
    token_seconds: float = 0.0
    setup_seconds: float = 0.0
    horizon: int | None = None
    probe: int = 0


NOTHING = Offer()
# A draft must promise this much more speed than the target alone: its estimates are noisy (docs/benchmarks.md,
# "The planner's and the copier's constants"); the host's time is priced (CostModel.round_cost).
MARGIN = 1.05


def priced(offer: Offer, cost: CostModel, room: int) -> tuple[int, float]:
    """The offer's best k and its tokens per second, its setup spread over its horizon (k 0: it cannot win)."""
    k, rate = best_k(offer.survival, cost, offer.token_seconds)
    return k, amortized(rate, offer.setup_seconds, room if offer.horizon is None else offer.horizon) if k else 0.0


def wins(offer: Offer, cost: CostModel, room: int) -> bool:
    """Whether the offer beats the target alone by MARGIN, priced as the planner prices it."""
    return priced(offer, cost, room)[1] > MARGIN / cost.alone


@dataclass(frozen=True)
class Verdict:
    """A finished round: `by` drafted `drafted` tokens (None: the target alone), `accepted` of them held;
    `probe` says the planner took its probe; `confidence` is the target's top probability at each emitted
    position it computed (given where a drafter is `confident`); `times` its seconds so far (its verification
    done) and the decodes it ran."""

    by: Drafter | None
    drafted: int
    accepted: int
    confidence: Sequence[float] = ()
    probe: bool = False
    times: Times = field(default_factory=Times)


class Drafter(ABC):
    """A source of draft tokens (see the module docstring for the protocol)."""

    name: ClassVar[str] = "drafter"
    max_k: ClassVar[int] = 64  # the longest proposal the planner asks of it
    # whether what it proposes is certain but for spelling (a grammar's forced tokens): then the planner takes
    # all of it, as a certain token costs less in any batch than in a round of its own later
    certain: ClassVar[bool] = False
    # whether it learns from the target's confidence (Verdict.confidence, computed only where a drafter is)
    confident: ClassVar[bool] = False

    def begin(self, prompt_len: int, *, fill: bool = False) -> None:
        """A new generation begins; its output follows the first prompt_len tokens of the context. With `fill`
        it fills a gap in that context (fill-in-the-middle): new text beside it, not a rewrite of it."""

    def reset(self) -> None:
        """Forget the context (a new conversation); what was learned about the text may stay."""

    def end(self, ctx: Sequence[int]) -> None:
        """The generation ended: ctx is its prompt and output (to keep what a later one may use)."""

    @abstractmethod
    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        """What it would propose to follow ctx now, at most k_max tokens, with `room` tokens left to generate;
        `cost` is the machine's (None under a fixed k, where only the survival counts)."""

    @abstractmethod
    def draft(self, ctx: list[int], k: int, sampler: SamplerSettings, sampling: InvariantSampling) -> list[int]:
        """Propose exactly k tokens to follow ctx (k never exceeds what its offer held, or max_k). A drafter
        that samples picks with `sampling` at the positions its tokens take (the target's own noise)."""

    def accept(self, ctx: list[int], verdict: Verdict) -> None:
        """Learn from a finished round: ctx ends with the tokens it emitted, the accepted draft tokens first. The
        target's cache now holds ctx but its last token: any state past that is stale."""


DrafterFactory = Callable[["Model"], Drafter]  # the target model -> a drafter for it
REGISTRY: dict[str, DrafterFactory] = {}


def register(name: str, factory: DrafterFactory) -> None:
    """Make a drafter available by name (LocalSpec.load(drafters=[name]), RunConfig.drafters); the built-in
    copier is registered so, as "copier" (a registration under that name replaces it)."""
    REGISTRY[name] = factory
