"""The cost-aware planner and the copier, without a model (pure logic)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.decoding.planner import Planner
from localspec.drafting.base import Drafter, Offer, Verdict
from localspec.drafting.copier import Copier, LineJoin
from localspec.drafting.costs import CostModel, best_k
from localspec.drafting.draft_model import Acceptance, DraftModelDrafter
from localspec.drafting.kept import Choice, Kept
from localspec.drafting.policy import DraftPolicy
from localspec.drafting.prior import SEEN_TOKENS


def _cache(cached: list[int] | None = None) -> SimpleNamespace:
    """A draft model for planning logic only: its cache is a token list, nothing is decoded."""
    model = SimpleNamespace(tokens=list(cached or []), path="draft.gguf")
    model.trim = lambda n: model.tokens.__delitem__(slice(n, None))
    return model


def _model(cost: CostModel | None, cached: list[int] | None = None) -> DraftModelDrafter:
    """A model drafter for planning logic only (see _cache)."""
    return DraftModelDrafter(_cache(cached), cost)  # type: ignore[arg-type]


CPU = CostModel({1: 0.054, 2: 0.071, 4: 0.129, 8: 0.342, 16: 0.462, 32: 0.576}, draft=0.026)
MID = CostModel({1: 0.050, 2: 0.055, 4: 0.060, 8: 0.080, 16: 0.120, 32: 0.200}, draft=0.020)
FLAT = CostModel({1: 0.020, 2: 0.020, 4: 0.021, 8: 0.021, 16: 0.022, 32: 0.024}, draft=0.002)


def test_picks_k0_when_drafting_cannot_win() -> None:
    """The measured CPU curve: a model draft at alpha 0.6 costs more than it saves at any k."""
    k, rate = best_k(Acceptance(0.6, 1, sure=1).survival(16), CPU, CPU.draft_token)
    assert k == 0 and rate == 1 / CPU.verify_cost(1)


def test_picks_large_k_when_verify_is_flat_and_alpha_high() -> None:
    k, _ = best_k(Acceptance(0.95, 1, sure=1).survival(16), FLAT, FLAT.draft_token)
    assert k >= 8


def test_ngram_long_copies_use_wide_verify_on_cpu() -> None:
    """A free draft with a copy that holds: the CPU's cheap wide batches win."""
    k, rate = best_k([0.99**j for j in range(1, 33)], CPU, 0.0)
    assert k >= 16 and rate > 2 / CPU.verify_cost(1)


def test_interpolation_and_running_average() -> None:
    cost = CostModel({1: 0.05, 8: 0.30})
    assert abs(cost.verify_cost(4) - (0.05 + 0.25 * 3 / 7)) < 1e-12
    assert cost.verify_cost(16) > cost.verify_cost(8)
    cost.observe_verify(8, 0.40)
    assert 0.30 < cost.verify_cost(8) < 0.40
    assert cost.verify_cost(1) > 0.05  # a slower machine: the whole curve follows (the scale)
    for _ in range(50):
        cost.observe_verify(1, 0.025)
    # faster than kept is the hardware's own speed: that size is learned at once, the session's scale is back to 1
    assert abs(cost.verify_cost(1) - 0.025) < 1e-3 and cost.scale == 1.0 and cost.verify_cost(8) < 0.31


def test_load_moves_the_draft_with_the_target_and_a_stall_does_not_bend_the_curve() -> None:
    """Under load the draft looks no cheaper than before (it slows with the target, even unmeasured)."""
    cost = CostModel({1: 0.029, 2: 0.047, 4: 0.076, 8: 0.135}, draft=0.016)
    for _ in range(30):
        cost.observe_verify(1, 2 * 0.029)  # the machine got twice as slow; the draft did not run meanwhile
    assert cost.verify_cost(1) > 1.9 * 0.029
    assert cost.draft_token / cost.verify_cost(1) > 0.9 * 0.016 / 0.029
    assert cost.verify_cost(2) / cost.verify_cost(1) > 0.9 * 0.047 / 0.029
    shape = cost.verify_cost(4) / cost.verify_cost(1)
    cost.observe_verify(4, 50 * cost.verify_cost(4))  # one decode stalled by a page fault or a burst of load
    assert cost.verify_cost(4) / cost.verify_cost(1) < 1.15 * shape
    interpolated = cost.verify_cost(3) / cost.verify_cost(1)
    cost.observe_verify(3, 1.0)  # a new size, its one measurement far off
    assert cost.verify_cost(3) / cost.verify_cost(1) < 1.35 * interpolated


def test_planner_never_rechecks_a_model_that_cannot_win() -> None:
    """A draft model as slow as a 2-core CPU's (c near 1): even always right it loses, so never recheck it."""
    cost = CostModel(dict(CPU.verify), draft=0.045)
    planner = Planner([_model(cost)], k=None, cost=cost)
    for _ in range(300):
        plan = planner.plan([1, 2, 3], room=64)
        assert plan.drafter is None
        planner.accept([1, 2, 3, 4], plan, accepted=0)


def test_planner_rechecks_the_model_and_backs_off() -> None:
    planner = Planner([_model(MID, [1, 2])], k=None, cost=MID)
    kinds = []
    for _ in range(120):
        plan = planner.plan([1, 2, 3], room=64)
        kinds.append(plan.drafter.name if plan.drafter else "none")
        planner.accept([1, 2, 3, 4], plan, accepted=0)
    lost = kinds.index("none")  # the prior alpha drafts at first; every draft is rejected
    rechecks = [i for i, kind in enumerate(kinds) if kind == "draft_model" and i > lost]
    assert lost < 10 and len(rechecks) >= 3 and kinds.count("none") > 100
    assert all(b - a >= 8 for a, b in itertools.pairwise(rechecks))  # never more often than every 8 rounds
    assert rechecks[-1] - rechecks[-2] > rechecks[1] - rechecks[0]  # losing rechecks back off


def test_fixed_k_uses_ngram_match_else_model() -> None:
    ngram = Copier()
    planner = Planner([ngram, _model(None)], k=4, cost=None)
    ctx = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    plan = planner.plan(ctx, room=64)
    assert (
        plan.drafter is ngram
        and plan.k == 4
        and ngram.draft(ctx, 4, SamplerSettings(), InvariantSampling(0)) == [7, 8, 9, 10]
    )
    fresh = Planner([Copier(), _model(None)], k=4, cost=None)
    drafter = fresh.plan([1, 2, 3], room=64).drafter
    assert drafter is not None and drafter.name == "draft_model"


def _replay(ctx: list[int], continuation: list[int], k: int, drafter: Copier | None = None) -> tuple[int, int]:
    """Feed a known continuation through the drafter: (rounds, accepted tokens)."""
    drafter, rounds, accepted, i = drafter or Copier(), 0, 0, 0
    while i < len(continuation):
        prop = drafter.propose(ctx, k)
        a = 0
        while a < len(prop) and i + a < len(continuation) and prop[a] == continuation[i + a]:
            a += 1
        n = min(a + 1, len(continuation) - i)
        ctx = ctx + continuation[i : i + n]
        i += n
        rounds, accepted = rounds + 1, accepted + a
        drafter.learn(ctx, a)
    return rounds, accepted


def test_copy_is_followed_and_a_repeated_rename_is_learned() -> None:
    source = [100, 1, 2, 3, 4, 50, 5, 6, 7, 8, 50, 9, 10, 11, 12, 50, 13, 14, 15, 16, 50, 17, 18]
    prompt = [0, *source, 0]
    renamed = [100, 1, 2, 3, 4, 60, 61, 5, 6, 7, 8, 60, 61, 9, 10, 11, 12, 60, 61, 13, 14, 15, 16, 60, 61, 17, 18]
    rounds, accepted = _replay(prompt, renamed, 32)
    assert accepted >= len(renamed) - 8  # only the first rename and resynchronizing cost target steps
    assert rounds <= 8


def test_the_output_repeating_itself_is_trusted_less_than_a_quote_of_the_input() -> None:
    """The same 3-token match: in the prompt it is likely a quote, in the answer's own text often a coincidence."""
    phrase = [7, 8, 9, 10, 11, 12, 13, 14]
    quote, echo = Copier(), Copier()
    quote_prompt, echo_prompt = [1, 2, *phrase, 3], [1, 2, 3]
    quote.begin(len(quote_prompt))
    echo.begin(len(echo_prompt))
    quote_ctx, echo_ctx = [*quote_prompt, 4, 7, 8, 9], echo_prompt + phrase + [4, 7, 8, 9]
    assert quote.propose(quote_ctx, 5) == echo.propose(echo_ctx, 5) == [10, 11, 12, 13, 14]
    assert all(e < q for q, e in zip(quote.holds(5), echo.holds(5), strict=False))
    here = CostModel({1: 0.029, 2: 0.047, 4: 0.076, 8: 0.135, 16: 0.154, 32: 0.250})  # a measured AVX-512 curve
    assert best_k(quote.holds(5), here, 0.0)[0] > 0 and best_k(echo.holds(5), here, 0.0)[0] == 0


def test_no_match_proposes_nothing() -> None:
    assert Copier().propose([1, 2, 3, 4], 8) == []


VOCAB = [
    "<s>",
    "The",
    " cat",
    " sat",
    "\n",
    "on",
    " on",
    " the",
    " mat",
    ",\n",
    ",",
    "and",
    " and",
    " dog",
    "res",
    "ted",
    " rested",
    ".",
    "\n\n",
    "A",
    " A",
]


def _tokenize(text: str) -> list[int]:
    """Greedy longest-match tokenizer over VOCAB (a toy stand-in for the target's BPE)."""
    out = []
    while text:
        tok = max((i for i, v in enumerate(VOCAB) if v and text.startswith(v)), key=lambda i: len(VOCAB[i]))
        out.append(tok)
        text = text[len(VOCAB[tok]) :]
    return out


def _join() -> LineJoin:
    return LineJoin(lambda t: VOCAB[t].encode(), _tokenize)


def test_line_join_tokens() -> None:
    join, t = _join(), _tokenize
    assert join(t("\nrested on")) == (3, tuple(t(" rested")))  # the whole word, tokenized as written
    assert join(t(",\nand the")) == (2, tuple(t(", and")))
    assert join(t("\n\nThe")) is None and join(t(" cat sat")) is None and join(t("\n.")) is None


def test_copy_joins_wrapped_lines_once_seen() -> None:
    """A summary quoting a hard-wrapped source: after the first joined line break, the rest copy straight."""
    source = _tokenize("The cat sat\non the mat,\nand the dog\nrested on the mat,\nand the cat sat\non the mat.")
    output = _tokenize("The cat sat on the mat, and the dog rested on the mat, and the cat sat on the mat.")
    prompt = [0, *source, 18]
    plain_rounds, plain_accepted = _replay(prompt, output, 32)
    drafter = Copier(_join())
    rounds, accepted = _replay(prompt, output, 32, drafter)
    assert drafter.join_lines and accepted >= len(output) - 4 and rounds <= 4
    assert rounds < plain_rounds and accepted > plain_accepted


def test_line_joining_is_unlearned_when_the_output_keeps_line_breaks() -> None:
    drafter = Copier(_join())
    source = _tokenize("The cat sat\non the mat,\nand the dog\nrested.")
    _rounds, accepted = _replay([0, *source, 18], source, 32, drafter)
    assert not drafter.join_lines and accepted >= len(source) - 4


def test_prediction_drafter_never_proposes_or_looks_up_its_boundary_marks() -> None:
    """The prediction's ends are marked with -1 in the copier's view: no proposal holds it, and the
    line-joiner never asks the tokenizer for its text (llama.cpp aborts on a negative id)."""
    from localspec.drafting.prediction import PredictionDrafter

    def piece(t: int) -> bytes:
        assert t >= 0, "asked for the text of a boundary mark"
        return VOCAB[t].encode() if t < len(VOCAB) else b"x"

    prediction = _tokenize("The cat sat\non the mat.")
    drafter = PredictionDrafter(prediction, LineJoin(piece, _tokenize))
    drafter.copier.join_lines = True
    drafter.begin(3)
    ctx = [0, 1, 2]
    for _ in range(12):
        proposal = drafter.draft(ctx, 8, None, None)  # type: ignore[arg-type]
        assert -1 not in proposal
        ctx = [*ctx, *(proposal[:2] or [19])]
        drafter.accept(ctx, Verdict(drafter, len(proposal), min(len(proposal), 1)))


class _Certain(Drafter):
    """A stand-in for the grammar's forced tokens: certain proposals."""

    name, certain = "forced", True

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def offer(self, ctx: list[int], k_max: int, room: int, cost: CostModel | None) -> Offer:
        return Offer([0.99**j for j in range(1, len(self.tokens[:k_max]) + 1)])

    def draft(self, ctx: list[int], k: int, sampler: object, sampling: object) -> list[int]:
        return self.tokens[:k]


def test_a_certain_draft_is_taken_whole_where_a_shorter_one_prices_better() -> None:
    steep = CostModel({1: 0.05, 4: 0.10, 8: 0.30})  # a CPU whose batches of more than 4 cost much more
    certain = [0.99**j for j in range(1, 8)]
    assert best_k(certain, steep, 0.0)[0] == 3
    plan = Planner([Copier(), _Certain(list(range(7)))], k=None, cost=steep).plan([1, 2, 3], room=64)
    assert plan.drafter is not None and plan.drafter.name == "forced" and plan.k == 7


RECORDS = [
    '"',
    "Maria",
    " Maria",
    " Fern",
    " (",
    "account",
    " AC",
    "AC",
    "-",
    "2",
    "0",
    "9",
    ")",
    ".",
    "{",
    "name",
    "id",
    ":",
]


def test_under_a_grammar_values_quoted_from_the_input_are_copied_field_after_field() -> None:
    """JSON fields quoted from prose: the grammar forces the keys and quotes, the value's first word comes
    without its leading space ('"Maria' for ' Maria'), and the next field resumes near the last one."""
    t = {piece: i for i, piece in enumerate(RECORDS)}.__getitem__
    prompt = [t(p) for p in [" Maria", " Fern", " (", "account", " AC", "-", "2", "0", "9", ")", "."]]
    copier, forced = Copier(piece=lambda i: RECORDS[i].encode()), _Certain([])
    copier.begin(len(prompt))
    ctx = [
        *prompt,
        *map(t, ["{", "name", ":", '"']),
        t("Maria"),
    ]  # the grammar forced '{name:"'; the target wrote Maria
    copier.accept(ctx, Verdict(forced, 4, 4))
    assert copier.propose(ctx, 2) == [t(" Fern"), t(" (")]
    ctx += [t(" Fern"), t('"')]  # the copy held one token, then the value ended
    copier.accept(ctx, Verdict(copier, 2, 1))
    assert copier.propose(ctx, 4) == []  # the quote was the target's: no match
    ctx += [*map(t, ["id", ":", '"']), t("AC")]  # the grammar forced the next key; the target wrote AC
    copier.accept(ctx, Verdict(forced, 3, 3))
    assert copier.propose(ctx, 4) == [t("-"), t("2"), t("0"), t("9")]
    resumed = copier.holds(4)
    ctx += [t("-"), t("2"), t("0"), t("9"), t('"')]
    copier.accept(ctx, Verdict(copier, 4, 4))
    ctx += [t("{"), t("name")]
    copier.accept(ctx, Verdict(forced, 1, 1))
    assert copier.propose(ctx, 4) == []  # the grammar's own tokens are never matched
    plain = Copier(piece=lambda i: RECORDS[i].encode())  # no grammar: 'AC' does not match ' AC'
    plain.begin(len(prompt))
    assert plain.propose([*prompt, t('"'), t("AC")], 4) == []
    fresh = Copier()
    fresh.begin(len(prompt))
    assert resumed[0] > fresh.stats.holds(0, 1, 1)[0]  # a resumed field is trusted more than a fresh short match


def test_a_middle_trusts_a_short_copy_of_its_context_as_little_as_an_echo() -> None:
    """Fill-in-the-middle: the middle is new code beside its context, so a short match there is mostly a
    sibling's likeness, not a quote."""
    phrase = [7, 8, 9, 10, 11, 12, 13, 14]
    quote, middle = Copier(), Copier()
    prompt = [1, 2, *phrase, 3]
    quote.begin(len(prompt))
    middle.begin(len(prompt), fill=True)
    ctx = [*prompt, 4, 7, 8, 9]
    assert quote.propose(ctx, 5) == middle.propose(ctx, 5) == [10, 11, 12, 13, 14]
    assert quote.holds(5) and middle.holds(5) == []  # a 3-token likeness: not worth a verify in a middle


class LoadNow:
    """A draft model's load that is over as soon as it starts (BackgroundLoad without its thread: deterministic)."""

    def __init__(self, load: Any, tokens: Any) -> None:
        self.model = load()
        self.started = True

    def ready(self) -> bool:
        return True

    def result(self) -> Any:
        return self.model

    def cancel(self) -> None:
        self.model = None


def test_the_draft_model_is_loaded_once_the_answer_so_far_would_have_repaid_it() -> None:
    """Ski rental: a draft model explored here starts loading beside the target once its load's price (what it
    costs the target: a small share of its seconds where decodes are memory-bound) and catch-up are repaid over as
    many tokens as the rest of the answer is likely to be (this pair's answers were 100 long), or as it has so far;
    it drafts from the round it is ready.
    A dear load never starts in a short answer; one in use starts from the answer's first rounds where its price
    is repaid, one the user named whatever its price; one loaded already drafts from the start."""
    from pathlib import Path

    def first_draft(choice: Choice, load: float) -> int | None:
        policy = DraftPolicy("draft", "draft.gguf", choice, Kept(load=load, answer=100.0), 0.2, FLAT)
        drafter = DraftModelDrafter(lambda: _cache(), FLAT, policy=policy, path=Path("draft.gguf"), background=LoadNow)  # type: ignore[arg-type, return-value]
        planner = Planner([drafter], k=None, cost=FLAT)
        drafter.begin(len(prompt))
        return next((n for n in range(1, 100) if planner.plan(prompt + [1] * n, room=100).drafter is drafter), None)

    prompt = list(range(100))
    cheap, dear = first_draft("explore", 0.3), first_draft("explore", 30.0)
    assert cheap is not None and SEEN_TOKENS <= cheap < 30 and dear is None, (cheap, dear)
    used, named = first_draft("use", 0.3), first_draft("named", 30.0)  # from the first rounds: its price is repaid
    assert used is not None and used < SEEN_TOKENS and first_draft("use", 30.0) is None, used
    assert named is not None and named <= 3  # the user's choice, whatever its price
    loaded = _model(FLAT)
    loaded.begin(len(prompt))
    assert Planner([loaded], k=None, cost=FLAT).plan([*prompt, 1], room=400).drafter is loaded


# A Q8_0 target and the 0.5B draft on a 2-core Intel Xeon (costs.json after a user's runs): a borderline pair.
Q8_0 = CostModel(
    {1: 0.119, 2: 0.126, 3: 0.147, 4: 0.161, 5: 0.253, 8: 0.360, 16: 0.442}, draft=0.038, draft_prefill=0.0062
)


def _policy(choice: Choice, *, load_estimate: float = 0.3, agreement: float | None = None) -> DraftPolicy:
    """A session's policy on a draft model whose verdict is kept (`choice`), its load expected to take so long."""
    return DraftPolicy("draft", "draft.gguf", choice, Kept(agreement=agreement, load=load_estimate), 0.2, Q8_0)


def _on_demand(load_seconds: float, agreement: float = 1.0) -> tuple[DraftModelDrafter, list[int]]:
    """A draft model explored here, loaded where it may win (the list counts its loads), after a 54-token prompt."""
    from pathlib import Path

    loads: list[int] = []

    def load() -> SimpleNamespace:
        loads.append(1)
        return _cache()

    policy = _policy("explore", load_estimate=load_seconds, agreement=agreement)
    drafter = DraftModelDrafter(load, Q8_0, policy=policy, path=Path("draft.gguf"), background=LoadNow)  # type: ignore[arg-type]
    drafter.begin(54)
    return drafter, loads


def _answer(planner: Planner, top: float, tokens: int) -> list[str]:
    """The planner's choices over an answer the target writes alone while it is `top` sure of each token."""
    ctx, kinds = list(range(54)), []
    for _ in range(tokens):
        plan = planner.plan(ctx, room=400)
        kinds.append(plan.drafter.name if plan.drafter else "none")
        if plan.drafter:
            break
        ctx.append(7)
        planner.accept(ctx, plan, 0, [top])
    return kinds


def test_the_draft_model_is_loaded_only_where_the_target_is_sure() -> None:
    """On a borderline pair the target's own confidence says whether the draft would hold (it held 0.58 of its
    tokens on an open chat where the target's top probability averaged 0.63, 0.93 on code at 0.94): text the
    target is unsure of is answered without loading an explored draft model, not even to recheck it; code loads
    it once the answer so far would have repaid its load's price and catch-up."""
    drafter, loads = _on_demand(load_seconds=0.3)
    prose = _answer(Planner([drafter], k=None, cost=Q8_0), top=0.4, tokens=300)
    assert set(prose) == {"none"} and not loads and drafter.loaded is None
    drafter, loads = _on_demand(load_seconds=0.3)
    code = _answer(Planner([drafter], k=None, cost=Q8_0), top=0.94, tokens=300)
    assert code[-1] == "draft_model" and SEEN_TOKENS < len(code) < 32


def test_the_load_is_priced_into_the_first_draft() -> None:
    """A load that takes longer than the draft model would save over the tokens left is not paid for."""
    slow, _ = _on_demand(load_seconds=20.0)
    assert set(_answer(Planner([slow], k=None, cost=Q8_0), top=0.94, tokens=100)) == {"none"}
    loaded = _model(Q8_0)
    loaded.begin(54)
    assert _answer(Planner([loaded], k=None, cost=Q8_0), top=0.94, tokens=100) == ["draft_model"]


def test_the_agreement_is_learned_and_alpha_follows_the_text() -> None:
    """Rounds whose tokens hold with probability 0.85 x the target's top probability (varying 0.5-0.97 by
    text) teach an agreement of 0.85 (seeded; within 0.12, the decayed counts' noise over ~20 rounds), started
    from a wrong prior; alpha then follows the target's confidence."""
    import numpy as np

    rng = np.random.default_rng(5)
    acceptance = Acceptance.prior(1.2)
    for _ in range(400):
        top = float(rng.uniform(0.5, 0.97))
        held = int(np.argmin(rng.random(4) < 0.85 * top)) if not (rng.random(4) < 0.85 * top).all() else 4
        acceptance.observe(4, held, [top] * (held + 1))
    assert abs(acceptance.agreement - 0.85) < 0.12
    for _ in range(60):
        acceptance.observe(0, 0, [0.6])
    assert abs(acceptance.alpha - 0.85 * 0.6) < 0.1


def test_learned_edits_are_bounded_the_least_recently_used_dropped_first() -> None:
    """A server's copier lives as long as the server: its learned edits stay at MAX_EDITS, and an edit in use
    outlives ones learned after it."""
    from localspec.drafting.copier import MAX_EDITS, Rewrites

    rewrites = Rewrites()
    rewrites.learn((1, 2), (3,))
    for i in range(MAX_EDITS + 100):
        rewrites.learn((1000 + i,), (5,))
        if i % 50 == 0:
            assert rewrites.at([1, 2], 0, {1}) == (2, (3,))  # used now and then
    assert len(rewrites.edits) == MAX_EDITS and (1, 2) in rewrites.edits and (1000,) not in rewrites.edits


def test_the_copier_converts_only_what_the_context_appended() -> None:
    """The copier's array of the context follows it as it grows, and starts afresh on another context (a new
    generation): its proposals then are those of a copier that never saw the first."""
    source = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    ctx = [1, *source, 2, 5, 6, 7]
    grown = Copier()
    for n in range(1, len(ctx) + 1):
        assert grown._tokens(ctx[:n]).tolist() == ctx[:n]
    assert grown._tokens([*ctx, *range(600)]).tolist() == [*ctx, *range(600)]  # past its first capacity
    other = [3, *source[::-1], 2, 14, 13]
    grown.begin(len(other) - 2)
    fresh = Copier()
    fresh.begin(len(other) - 2)
    assert grown.propose(other, 4) == fresh.propose(other, 4) == [12, 11, 10, 9]
    assert grown._tokens([9, *other[1:]]).tolist() == [9, *other[1:]]  # another context of the same length
