"""The public Python API: load a model pair once, then generate from a prompt or chat messages.

    from localspec import LocalSpec

    spec = LocalSpec.load()
    run = spec.generate("Write a haiku about the sea.", temperature=0, max_tokens=64)
    for piece in run:
        print(piece.text, end="")
    print(run.stats.summary())

The CLI, the chat REPL and the bench are built on it.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from localspec.core.grammar import ANY_JSON_OBJECT, Constraint, GrammarError, compile_grammar, json_schema_grammar
from localspec.core.sampling import SamplerSettings, TokenLogprob
from localspec.core.stats import Piece, Stats, prediction_usage
from localspec.core.tool_calls import ToolCall, ToolCallStream, call_grammar, parse_tool_calls
from localspec.decoding.engine import Engine, Request
from localspec.decoding.loader import RunConfig, draft_drafter, draft_path_of, load_engine
from localspec.drafting import store
from localspec.drafting.base import Drafter
from localspec.drafting.copier import LineJoin
from localspec.drafting.forced import ForcedDrafter
from localspec.drafting.policy import DraftPolicy
from localspec.drafting.prediction import PredictionDrafter
from localspec.errors import Unsupported
from localspec.llama.grammar import grammar_tokenizer
from localspec.llama.model import ContextFull, Model
from localspec.llama.prompts import HOLD_SECONDS
from localspec.llama.template import Message, chat_tokens, fim_tokens, raw_tokens, supports_tools, tool_tags
from localspec.models.catalog import catalog, default_pair
from localspec.settings import MODELS, RUN, SAMPLER, checked, default

__all__ = [
    "ANY_JSON_OBJECT",
    "HOLD_SECONDS",
    "MAX_LOGPROBS",
    "ContextFull",
    "Generation",
    "LocalSpec",
    "Message",
    "Options",
    "Piece",
    "Prepared",
    "Prompt",
    "RunConfig",
    "SamplerSettings",
    "Stats",
    "TokenLogprob",
    "ToolCall",
    "ToolCallStream",
    "json_schema_grammar",
    "model_id",
    "prediction_usage",
    "run_config",
    "structure_grammar",
]

Prompt = str | Sequence[Message]
ToolChoice = Literal["auto", "none", "required"] | dict[str, Any]
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI allows


class Generation:
    """One generation, streamed: iterate it for Pieces (text, and whether it was an accepted draft);
    once it is done, `text` and `stats` hold the whole answer and its figures."""

    def __init__(self, engine: Engine, request: Request, tool_names: Sequence[str] = ()) -> None:
        self._run = engine.generate(request)
        self._drafter = draft_drafter(engine)
        self.tool_names = tool_names  # the tools described: the answer may call them
        self._pieces: list[str] = []
        self.seed = request.seed  # the seed this generation samples with: the same seed gives the same text
        self.sampler = request.sampler  # its own sampler settings (another generation's never change them)
        self.prediction = next((d.prediction for d in request.drafters if isinstance(d, PredictionDrafter)), None)
        self.stats = self._run.stats  # this generation's figures (complete once it has ended)
        # the log-probability of each completion token, when asked for (`logprobs`)
        self.logprobs: list[TokenLogprob] | None = self._run.logprobs

    def __iter__(self) -> Generator[Piece, None, None]:
        pieces = iter(self._run)
        try:
            for piece in pieces:
                self._pieces.append(piece.text)
                yield piece
        finally:  # stopped early (a client gone, Ctrl-C): the generation ends now, its figures complete
            pieces.close()
            if self._drafter is not None and self._drafter.joined is not None:  # it joined in this answer
                self.stats.draft_load_beside = self._drafter.beside

    def result(self) -> str:
        """Run to the end (if not iterated yet) and return the whole text."""
        if not self._run.started:
            for _ in self:
                pass
        return self.text

    @property
    def text(self) -> str:
        """The text produced so far."""
        return "".join(self._pieces)

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tools the answer calls (with `tools` given; complete once it has ended)."""
        return parse_tool_calls(self.text, self.tool_names)[1] if self.tool_names else []

    @property
    def content(self) -> str:
        """The text without its tool calls."""
        return parse_tool_calls(self.text, self.tool_names)[0] if self.tool_names else self.text

    @property
    def finish_reason(self) -> str:
        """'stop', 'length' (max_tokens or the context), or 'tool_calls'."""
        if self.tool_calls:
            return "tool_calls"
        return "length" if self.stats.finish_reason == "length" else "stop"

    @property
    def prompt_tokens(self) -> list[int]:
        return list(self._run.request.prompt)

    @property
    def tokens(self) -> list[int]:
        """The completion's tokens so far."""
        return list(self._run.tokens)


@dataclass(frozen=True)
class Options:
    """How one generation runs, each value checked once (ValueError naming it): as it is made, the sampler's
    overrides as LocalSpec.prepare puts them into the session's sampler. None: the session's.

    `sampler` replaces the session's sampler settings, and `temperature`, `top_k`, `top_p`, `min_p` override single
    ones of it; `seed` None is the session's seed (a fresh one where it has none); `max_tokens` None is the table's.
    The sampler settings apply identically to the target and the drafts; a seed makes sampled text repeatable;
    temperature 0 is greedy. `prediction` is text the answer is expected to repeat (a file being rewritten, say):
    a draft source, which changes how fast the answer comes, never what it says. `response_format` is OpenAI's
    ({"type": "json_object"}, or "json_schema" with its schema) and `grammar` a GBNF or Lark grammar: the answer
    follows it, and what it forces is drafted. `tools` (OpenAI's function tools) are described to the model;
    `tool_choice` is "auto", "none", "required" or {"type": "function", "function": {"name": ...}} (the last two
    enforce a valid call). `logprobs` asks for each token's log-probability with that many alternatives (0-20).
    `suffix` makes a fill-in-the-middle completion of a string prompt. `max_draft` caps the tokens any round
    drafts (0: the target alone; None: as loaded). `raw` takes a string prompt as it is (no chat template).
    `cache_key` names the conversation (a client's session, say): the prompt cache holds the newest state it used or
    made from eviction by other traffic until the key goes unused for `cache_hold` seconds.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    sampler: SamplerSettings | None = None
    stop: Sequence[str] = ()
    system: str | None = None
    raw: bool = False
    prediction: str | None = None
    response_format: dict[str, Any] | None = None
    grammar: str | None = None
    tools: Sequence[dict[str, Any]] | None = None
    tool_choice: ToolChoice = "auto"
    logprobs: int | None = None
    suffix: str | None = None
    max_draft: int | None = None
    cache_key: str | None = None
    cache_hold: float = HOLD_SECONDS

    def __post_init__(self) -> None:  # the sampler's overrides are checked where they meet the session's sampler
        for name in ("max_tokens", "seed"):
            if (value := getattr(self, name)) is not None:
                checked(name, value)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs: at most {MAX_LOGPROBS} alternatives, not {self.logprobs}")
        if self.max_draft is not None:
            if isinstance(self.max_draft, bool) or not isinstance(self.max_draft, int):
                raise ValueError(f"max_draft: a whole number of tokens, not {self.max_draft!r}")
            checked("max_draft", self.max_draft, "k")
        if self.cache_key is not None and not isinstance(self.cache_key, str):
            raise ValueError(f"cache_key: a string, not {self.cache_key!r}")
        hold = self.cache_hold
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 < hold < math.inf:
            raise ValueError(f"cache_hold: a number of seconds above 0, not {hold!r}")


@dataclass(frozen=True)
class Prepared:
    """A generation made ready by LocalSpec.prepare: its request (the prompt's tokens, checked against the context;
    the grammar; the drafters), the tools its answer may call, and how many tokens its prediction is."""

    request: Request
    tool_names: tuple[str, ...] = ()
    predicted: int = 0

    @property
    def tokens(self) -> tuple[int, ...]:
        """The prompt's tokens."""
        return self.request.prompt

    def capped(self, max_tokens: int) -> Prepared:
        """The same generation with another length cap."""
        return replace(self, request=replace(self.request, max_tokens=max_tokens))


class LocalSpec:
    """A loaded target (and draft) with speculative decoding; generations run one at a time."""

    def __init__(
        self, engine: Engine, config: RunConfig, load_seconds: float = 0.0, policy: DraftPolicy | None = None
    ) -> None:
        self.engine, self.config, self.load_seconds = engine, config, load_seconds
        self.policy = policy  # the session's draft-model policy (settled once, by save_costs)

    @classmethod
    def load(cls, target: str | None = None, draft: str = default("draft"), **options: Any) -> LocalSpec:
        """Load a pair: the same choices as the command line's options (target None: the default pair;
        `options`: run_config's)."""
        return cls.from_config(run_config(target, draft, **options))

    @classmethod
    def from_config(cls, config: RunConfig) -> LocalSpec:
        """Load a pair from a RunConfig (what the frontends build from their options)."""
        t0 = time.perf_counter()
        engine, policy = load_engine(config)
        return cls(engine, config, time.perf_counter() - t0, policy)

    @property
    def notes(self) -> list[str]:
        """Remarks from loading (a draft model left out where it cannot win, say)."""
        return self.policy.notes if self.policy is not None else []

    def tokens(
        self,
        prompt: Prompt,
        *,
        system: str | None = None,
        raw: bool = False,
        suffix: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt as the target's tokens: a string through the chat template (or as-is with raw; with
        a suffix, the text between them is asked for), or a list of {"role", "content"} messages through
        the chat template, `tools` described. LocalspecError where the model cannot (no FIM tokens, say)."""
        target = self.engine.target
        if isinstance(prompt, str):
            if suffix is not None:
                return fim_tokens(target, prompt, suffix)
            if raw:
                return raw_tokens(target, prompt)
            prompt = [{"role": "user", "content": prompt}]
        messages = ([{"role": "system", "content": system}] if system else []) + list(prompt)
        return chat_tokens(target, messages, tools=list(tools) if tools else None)

    def tokenize(self, text: str) -> list[int]:
        """Text as the target's tokens, without a start token (llama.cpp's tokenizer: safe beside decoding)."""
        return self.engine.target.tokenize(text)

    def piece(self, token: int) -> bytes:
        """The bytes a token of the target's writes (for showing log-probabilities)."""
        return self.engine.target.piece(token)

    def generate(self, prompt: Prompt, **options: Any) -> Generation:
        """Start a generation (it runs as it is iterated): `prepare(prompt, Options(**options))`, then `run`. The
        options are Options' fields; a bad one raises ValueError naming it, and a prompt that is empty or does not
        fit the context raises LocalspecError (ContextFull) here."""
        return self.run(self.prepare(prompt, Options(**options)))

    def prepare(self, prompt: Prompt, options: Options | None = None) -> Prepared:
        """The generation of `prompt` made ready, not started: the prompt tokenized and checked against the context
        (once: ContextFull where it does not fit), the grammar compiled, the tools checked, the drafters chosen.
        Settings `options` leave out are the session's."""
        o, target = options or Options(), self.engine.target
        given = {"temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "min_p": o.min_p}
        overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
        sampler = o.sampler or self.config.sampler
        sampler = replace(sampler, **overrides) if overrides else sampler  # new values checked as it is made
        seed = self.config.seed if o.seed is None else o.seed
        calls = _tools_in_use(o.tools, o.tool_choice)
        grammar_text = _grammar(o.response_format, o.grammar, calls, o.tool_choice, target)
        tokens = self.tokens(prompt, system=o.system, raw=o.raw, suffix=o.suffix, tools=calls)
        self.engine.check_prompt(tokens)  # here, not at the first token: a caller can answer before streaming
        constraint = (
            None if grammar_text is None else Constraint(grammar_tokenizer(target), grammar_text, target.n_vocab)
        )
        drafters: list[Drafter] = []
        predicted = target.tokenize(o.prediction) if o.prediction else []
        if self.engine.k != 0 and o.max_draft != 0:
            if predicted:
                drafters.append(PredictionDrafter(predicted, LineJoin(target.piece, target.tokenize)))
            if constraint is not None:
                drafters.append(ForcedDrafter(constraint))
        request = Request(
            tuple(tokens),
            default("max_tokens") if o.max_tokens is None else o.max_tokens,
            sampler,
            secrets.randbelow(2**31) if seed is None else seed,
            tuple(o.stop),
            tuple(drafters),
            constraint,
            o.logprobs,
            fill=o.suffix is not None or _fills(target, tokens),
            max_draft=o.max_draft,
            cache_key=o.cache_key,
            cache_hold=float(o.cache_hold),
        )
        return Prepared(request, tuple(t["function"]["name"] for t in calls), len(predicted))

    def run(self, prepared: Prepared) -> Generation:
        """Start a prepared generation (it runs as it is iterated; each Prepared runs once)."""
        return Generation(self.engine, prepared.request, prepared.tool_names)

    @property
    def k(self) -> int | None:
        """The draft length of the generations to come: None is the cost-aware choice of each round, 0 the
        target alone."""
        return self.engine.k

    @k.setter
    def k(self, value: int | None) -> None:
        if value is None and self.engine.cost is None:
            raise ValueError("k: automatic k needs the measured costs (load with k='auto')")
        if value is not None:
            checked("k", value)
            if value > 0 and not self.engine.drafters:
                raise ValueError("k: nothing drafts here (loaded with no_draft)")
        self.engine.k = value

    def check_response_format(self, response_format: dict[str, Any]) -> None:
        """Refuse (ValueError naming it) a response format the grammar engine cannot follow, before generating."""
        _grammar(response_format, None, [], "auto", self.engine.target)

    @property
    def n_ctx(self) -> int:
        """The context the target holds, in tokens."""
        return self.engine.target.n_ctx

    @property
    def target_path(self) -> Path:
        """The target's file."""
        return self.engine.target.path

    @property
    def draft_path(self) -> Path | None:
        """The file of the draft model loaded here (it loads at its first draft), if one is."""
        drafter = draft_drafter(self.engine)
        return drafter.path if drafter is not None and drafter.loaded is not None else None

    @property
    def pair(self) -> str:
        """The target and what drafts for it, in a few words ("target ← draft", "target + copies")."""
        engine, draft = self.engine, draft_path_of(self.engine)
        return engine.target.name + (f" ← {draft.name}" if draft else " + copies" if engine.drafters else " (no draft)")

    def prefill(self, prompt: Prompt, *, system: str | None = None) -> None:
        """Decode a conversation so far into the target's cache (its template's text without the reply's start),
        so that the next generation continuing it decodes only what is new."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        messages = ([{"role": "system", "content": system}] if system else []) + messages
        tokens = chat_tokens(self.engine.target, messages, add_generation_prompt=False) if messages else []
        if 0 < len(tokens) < self.engine.target.n_ctx:
            self.engine.target.sync(tokens, 0)

    def reset(self) -> None:
        """Empty every cache (a new conversation)."""
        self.engine.target.reset()
        for d in self.engine.drafters:
            d.reset()

    def save_costs(self) -> None:
        """Keep what this session learned about the machine's decode costs for the next run, and settle its
        choice about the draft model (once: the session's load and generating time is what the user spent)."""
        engine = self.engine
        if engine.cost is not None:
            seconds = self.load_seconds + engine.busy_seconds
            store.settle(store.model_key(engine.target), engine.cost, self.policy, seconds)
            self.policy = None


def run_config(
    target: str | None = None,
    draft: str = default("draft"),
    *,
    no_draft: bool = False,
    copier: bool = True,
    drafters: Sequence[str] = (),
    **settings: Any,
) -> RunConfig:
    """What loading a pair and sampling from it need: the one place a RunConfig is made. `settings` are the run
    settings of the settings table (localspec.settings.RUN: k, temperature, top_k, top_p, min_p, seed, ctx,
    threads, gpu_layers, draft_gpu_layers, flash_attn, exact, cache_ram, cache_disk, recall), each checked
    against it (ValueError naming it; TypeError for a name it lacks). `no_draft` runs the target alone, `copier`
    keeps the copier beside a draft model, and `drafters` names registered drafters
    (localspec.drafting.base.register) to try before the built-in ones."""
    if unknown := sorted(set(settings) - set(RUN[len(MODELS) :])):
        raise TypeError(f"run_config() got unexpected keyword arguments: {', '.join(unknown)}")
    given = {name: settings.get(name, default(name)) for name in RUN[len(MODELS) :]}
    sampler = SamplerSettings(*(given.pop(name) for name in SAMPLER))  # which checks its own, once
    values = {name: checked(name, value) for name, value in given.items()}
    k = values.pop("k")
    return RunConfig(
        target=target,
        draft=draft,
        no_draft=no_draft,
        copier=copier,
        k=None if k == "auto" else int(k),
        sampler=sampler,
        drafters=tuple(drafters),
        **values,
    )


def model_id(config: RunConfig) -> str:
    """The model id a pair answers to by default: the target's catalog name, or its file name without .gguf."""
    target = config.target or default_pair()[0].name
    return target if target in catalog() else Path(target).name.removesuffix(".gguf")


def _tools_in_use(tools: Sequence[dict[str, Any]] | None, choice: ToolChoice) -> list[dict[str, Any]]:
    """The tools the model is told of: none with tool_choice "none"; a named one must be among them."""
    if not tools or choice == "none":
        return []
    names = [t.get("function", {}).get("name") for t in tools]
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError("tools: every tool needs a function with a name")
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name")
        if name not in names:
            raise ValueError(f"tool_choice: no tool is named {name!r} (the tools are {', '.join(map(str, names))})")
    elif choice not in ("auto", "required"):
        raise ValueError(f"tool_choice: 'auto', 'none', 'required' or a function, not {choice!r}")
    return list(tools)


def _fills(target: Model, tokens: list[int]) -> bool:
    """Whether a prompt asks for a middle in the model's own FIM tokens (an editor writes them itself)."""
    middle = target.fim_tokens()[2]
    return middle >= 0 and middle in tokens


def _grammar(
    response_format: dict[str, Any] | None,
    grammar: str | None,
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    target: Model,
) -> str | None:
    """The grammar the answer follows, if any: a required call, a response format, or a given grammar."""
    if tools and choice != "auto":  # required, or a named function
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        if not supports_tools(target):
            raise Unsupported(f"{target.name}'s chat template has no tool calls in a format localspec reads", "tools")
        return call_grammar(tools, named, *tool_tags(target))
    return structure_grammar(response_format, grammar)


def structure_grammar(response_format: dict[str, Any] | None, grammar: str | None = None) -> str | None:
    """The grammar a response format (OpenAI's) or a GBNF/Lark `grammar` asks the answer to follow, if any;
    ValueError naming the field the grammar engine cannot follow (checked before any model loads)."""
    kind = (response_format or {}).get("type", "text")
    try:
        if kind == "json_object":
            return json_schema_grammar(ANY_JSON_OBJECT)
        if kind == "json_schema":
            spec = (response_format or {}).get("json_schema") or {}
            return json_schema_grammar(spec.get("schema") or ANY_JSON_OBJECT)
        if kind != "text":
            raise ValueError(f"response_format: 'text', 'json_object' or 'json_schema', not {kind!r}")
        return None if grammar is None else compile_grammar("gbnf", grammar)
    except GrammarError as e:
        raise ValueError(f"{'grammar' if grammar is not None and kind == 'text' else 'response_format'}: {e}") from None
