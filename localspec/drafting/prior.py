"""The draft model's prior: what it may gain here before it has drafted here, and what its load may cost.

A draft token at its size bound (`size_bound`, `by_size`), an acceptance of its agreement (kept, else 1) times
the target's confidence, against the target's curve as measured here (`promise`, `clear_win`); a load's seconds
and what it costs the target beside it (`load_estimate`, `beside_share`), each between what a memory-bound
machine (a GPU) and a compute-bound one (a CPU) show (`compute_bound`).
"""

from __future__ import annotations

from typing import Any

from localspec.drafting.costs import CostModel, amortized, best_k

ASSUMED_ALPHA = 0.9  # the acceptance a draft model is judged at where nothing says what the text is like
# How much faster than the target alone a draft model must promise to be loaded before it has drafted here (a
# clear win): the prior's costs are bounds and guesses, a one-token cost measured just after a load reads high,
# and its rounds cost Python time the curve leaves out (docs/benchmarks.md, "The draft model's policy").
WIN_MARGIN = 1.25
# A clear win's margin where decodes are memory-bound (a GPU): there the prior's draft token (its size's share of a
# decode) is what one costs, and a load beside the target costs it little; it rises to WIN_MARGIN as decodes turn
# compute-bound (CostModel.compute_share up to CPU_SHARE), where the prior errs high.
MEMORY_BOUND_MARGIN = 1.1
DRAFT_MAX_K = 16  # the longest draft a draft model makes
# A draft model on trial (a try, or one the user named) drafts TRIAL_K tokens in this many rounds where nothing
# else drafts, whatever its price (a guess until then), so that its costs and acceptance are measured.
TRIAL_ROUNDS, TRIAL_K = 4, 4
SIZE_MARGIN = 0.75  # a draft token costs at least this share of its file size against the target's, in decodes
SEEN_TOKENS = 8  # answer tokens whose confidence is seen before a draft model not loaded yet may be
# From a compute-bound share of a decode of CPU_SHARE on, a draft model's first load is priced at CPU_LOAD times the
# target's: loaded in the middle of an answer on a CPU it competes with the target's threads (docs/benchmarks.md,
# "The draft model's prior").
CPU_SHARE, CPU_LOAD = 0.25, 2.0
MEMORY_SHARE = 0.1  # up to this compute-bound share decodes are memory-bound: a load costs its file's share
# The share of the target's speed a draft model's load beside it takes, before one was measured here: an upload on
# a GPU (memory-bound decodes) little of it, a load on the CPU cores the target decodes on about half of it.
BESIDE_GPU, BESIDE_CPU = 0.1, 0.5


def size_bound(target_bytes: int, draft_bytes: int) -> float:
    """A draft token's least cost in target decodes, by file size: a decode reads every weight once, and a
    smaller model uses the machine about as well per byte (hence SIZE_MARGIN)."""
    return SIZE_MARGIN * draft_bytes / target_bytes


def by_size(cost: CostModel, bound: float) -> CostModel:
    """The best a draft model not measured yet may cost here: a draft token at its size bound (`bound`, in
    target decodes), and batches larger than any measured no dearer than the largest measured."""
    curve = cost.curve()
    curve.setdefault(64, max(curve.values()))
    return CostModel(
        curve,
        draft=bound * cost.verify_cost(1),
        host_round=cost.host_round,
        host_position=cost.host_position,
        host_draft=cost.host_draft,
    )


def promise(
    cost: CostModel, *, alpha: float = ASSUMED_ALPHA, room: int = 16, setup: float = 0.0, margin: float = WIN_MARGIN
) -> float:
    """A draft model's promised speedup over the target alone at acceptance `alpha` (amortizing `setup` seconds
    over `room` tokens), over `margin`: above 1 it promises a clear win; 0 where no k wins at all."""
    survival = [alpha**j for j in range(1, min(room, DRAFT_MAX_K) + 1)]
    k, rate = best_k(survival, cost, cost.draft_step)
    return amortized(rate, setup, room) * cost.alone / margin if k else 0.0


def clear_win(cost: CostModel, **at: Any) -> bool:
    """Whether a draft model with these costs promises to beat the target alone by WIN_MARGIN (or the `margin`
    given: `promise`). On a CPU, where a batch of k tokens costs nearly k single decodes, it never does with a
    Q4_K target."""
    return promise(cost, **at) > 1


def load_estimate(cost: CostModel, size_ratio: float, loaded_in: float) -> float:
    """What a draft model's first load here may take, the target's having taken `loaded_in`: its file's share of
    that where decodes are memory-bound (a load is a copy), up to CPU_LOAD times it as they are compute-bound (a
    load in the middle of an answer, beside the target on a CPU, is slower than on its own: `compute_bound`)."""
    if not cost.measured:
        return CPU_LOAD * loaded_in
    return loaded_in * (size_ratio + (CPU_LOAD - size_ratio) * compute_bound(cost, above=MEMORY_SHARE))


def compute_bound(cost: CostModel, *, above: float = 0.0) -> float:
    """How compute-bound decodes are here, 0-1: 0 up to a compute-bound share of `above`, 1 from CPU_SHARE on (a
    CPU whose cores a load beside the target competes for), linear between; 1 before any decode was measured."""
    if not cost.measured:
        return 1.0
    return min(max((cost.compute_share() - above) / (CPU_SHARE - above), 0.0), 1.0)


def beside_share(cost: CostModel) -> float:
    """The share of the target's speed a draft model's load beside it takes, before one was measured: BESIDE_GPU
    where decodes are memory-bound, up to BESIDE_CPU as they are compute-bound (its load then shares the cores)."""
    return BESIDE_GPU + (BESIDE_CPU - BESIDE_GPU) * compute_bound(cost)


def win_margin(cost: CostModel) -> float:
    """The promise a draft model not measured here must make to be explored: MEMORY_BOUND_MARGIN where decodes
    are memory-bound, up to WIN_MARGIN as they are compute-bound (where the prior errs high)."""
    return MEMORY_BOUND_MARGIN + (WIN_MARGIN - MEMORY_BOUND_MARGIN) * compute_bound(cost)


def try_estimate(bound: float, cost: CostModel, load: float) -> float:
    """What a first try of a draft model may cost here: its `load` (kept, else at most the target's) and its
    trial rounds, each TRIAL_K draft tokens (`bound` target decodes each) and a larger batch than the target
    alone's (priced by the curve, guessed high where not measured)."""
    one = cost.verify_cost(1)
    return load + TRIAL_ROUNDS * (TRIAL_K * bound * one + cost.verify_cost(TRIAL_K + 1) - one)


def draft_ratio(cost: CostModel) -> str:
    return f"a draft token costs {cost.draft_token / cost.verify_cost(1):.2f} target decodes"


def cannot_win(why: str) -> str:
    """What is said of a draft model left out because it cannot win here."""
    return (
        f"not loaded: here it cannot beat the target alone by {WIN_MARGIN:.2f}x even at {ASSUMED_ALPHA:.0%} "
        f"acceptance ({why})"
    )
