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

import secrets
from collections.abc import Generator, Sequence

from localspec.core.sampling import InvariantSampling, SamplerSettings
from localspec.core.stats import Piece, Stats
from localspec.decoding.engine import Engine
from localspec.decoding.loader import RunConfig, draft_model_of, load_engine
from localspec.drafting.base import Drafter
from localspec.drafting.calibration import save_costs
from localspec.drafting.copier import LineJoin
from localspec.drafting.prediction import PredictionDrafter
from localspec.llama.template import Message, chat_tokens, raw_tokens
from localspec.settings import SETTINGS

Prompt = str | Sequence[Message]


class Generation:
    """One generation, streamed: iterate it for Pieces (text, and whether it was an accepted draft);
    once it is done, `text` and `stats` hold the whole answer and its figures."""

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        max_tokens: int,
        stops: Sequence[str],
        drafters: Sequence[Drafter] = (),
        *,
        seed: int,
    ) -> None:
        self._engine, self._prompt, self._max_tokens, self._stops = engine, prompt, max_tokens, stops
        self._drafters = list(drafters)
        self._pieces: list[str] = []
        self._tokens: list[int] = []
        self._started = False
        self.seed = seed  # the seed this generation samples with: the same seed gives the same text
        self.prediction = next((d.prediction for d in drafters if isinstance(d, PredictionDrafter)), None)
        self.stats = Stats()  # this generation's figures (complete once it has ended)

    def __iter__(self) -> Generator[Piece, None, None]:
        if self._started:
            raise RuntimeError("a Generation can be iterated only once")
        self._started = True
        self._engine.sampling = InvariantSampling(self.seed)
        pieces = self._engine.generate(
            self._prompt, self._max_tokens, self._stops, self._drafters, stats=self.stats, completion=self._tokens
        )
        for piece in pieces:
            self._pieces.append(piece.text)
            yield piece

    def result(self) -> str:
        """Run to the end (if not iterated yet) and return the whole text."""
        if not self._started:
            for _ in self:
                pass
        return self.text

    @property
    def text(self) -> str:
        """The text produced so far."""
        return "".join(self._pieces)

    @property
    def prompt_tokens(self) -> list[int]:
        return list(self._prompt)

    @property
    def tokens(self) -> list[int]:
        """The completion's tokens so far."""
        return list(self._tokens)


class LocalSpec:
    """A loaded target (and draft) with speculative decoding; generations run one at a time."""

    def __init__(self, engine: Engine, config: RunConfig) -> None:
        self.engine, self.config = engine, config

    @classmethod
    def load(
        cls,
        target: str | None = None,
        draft: str = "auto",
        *,
        k: int | str = "auto",
        ctx: int = 4096,
        threads: int | None = None,
        gpu_layers: int = -1,
        draft_gpu_layers: int = -1,
        flash_attn: bool = False,
        copier: bool = True,
        no_draft: bool = False,
        seed: int | None = None,
        drafters: Sequence[str] = (),
    ) -> LocalSpec:
        """Load a pair: the same choices as the command line's options (target None: the default pair).

        `drafters` names registered drafters (localspec.drafting.base.register) to use besides the
        built-in ones, tried first.
        """
        values = {
            "k": k,
            "ctx": ctx,
            "threads": threads,
            "gpu_layers": gpu_layers,
            "draft_gpu_layers": draft_gpu_layers,
            "seed": seed,
        }
        for name, value in values.items():
            _check(name, value)
        config = RunConfig(
            target=target,
            draft=draft,
            no_draft=no_draft,
            copier=copier,
            k=None if k == "auto" else int(k),
            seed=seed,
            ctx=ctx,
            threads=threads,
            gpu_layers=gpu_layers,
            draft_gpu_layers=draft_gpu_layers,
            flash_attn=flash_attn,
            drafters=tuple(drafters),
        )
        return cls.from_config(config)

    @classmethod
    def from_config(cls, config: RunConfig) -> LocalSpec:
        """Load a pair from a RunConfig (what the frontends build from their options)."""
        return cls(load_engine(config), config)

    @property
    def notes(self) -> list[str]:
        """Remarks from loading (a draft model left out where it cannot win, say)."""
        return self.engine.notes

    def tokens(self, prompt: Prompt, *, system: str | None = None, raw: bool = False) -> list[int]:
        """The prompt as the target's tokens: a string through the chat template (or as-is with raw),
        or a list of {"role", "content"} messages through the chat template."""
        target = self.engine.target
        if isinstance(prompt, str):
            if raw:
                return raw_tokens(target, prompt)
            prompt = [{"role": "user", "content": prompt}]
        messages = ([{"role": "system", "content": system}] if system else []) + list(prompt)
        return chat_tokens(target, messages)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 512,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        seed: int | None = None,
        stop: Sequence[str] = (),
        system: str | None = None,
        raw: bool = False,
        prediction: str | None = None,
    ) -> Generation:
        """Start a generation (it runs as it is iterated). The sampler settings apply identically to the
        target and the drafts; a seed makes sampled text repeatable; temperature 0 is greedy.

        `prediction` is text the answer is expected to repeat (a file being rewritten, say): a draft
        source for this generation. It changes how fast the answer comes, never what it says.
        A prompt that is empty or does not fit the context raises LocalspecError (ContextFull) here.
        """
        settings = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "seed": seed,
        }
        for name, value in settings.items():
            _check(name, value)
        self.engine.sampler = SamplerSettings(temperature, top_k, top_p, min_p)
        drafters: list[Drafter] = []
        if prediction and self.engine.k != 0:
            target = self.engine.target
            drafters.append(PredictionDrafter(target.tokenize(prediction), LineJoin(target.piece, target.tokenize)))
        tokens = self.tokens(prompt, system=system, raw=raw)
        self.engine.check_prompt(tokens)  # here, not at the first token: a caller can answer before streaming
        seed = secrets.randbelow(2**31) if seed is None else seed
        return Generation(self.engine, tokens, max_tokens, list(stop), drafters, seed=seed)

    def save_costs(self) -> None:
        """Keep what this session learned about the machine's decode costs for the next run."""
        if self.engine.cost is not None:
            save_costs(self.engine.target, draft_model_of(self.engine), self.engine.cost)


def _check(name: str, value: object) -> None:
    try:
        SETTINGS[name].check(value)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
