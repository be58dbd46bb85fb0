"""Constrained decoding: a grammar masks the target's logits at every position (llguidance).

A grammar is compiled from a JSON Schema, a Lark or GBNF grammar, or a regex into llguidance's own
form (`compile_grammar`); a `Constraint` follows one generation through it. The mask is applied to the
raw logits before the sampler chain, so the output is exactly the target's distribution restricted to
the grammar, with or without drafting; where the grammar allows one continuation only, `forced()`
names its tokens before the model runs.

JSON is compact, as `json.dumps` writes it (", " and ": ", no newlines): a fixed layout leaves every
key name, quote and separator forced.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

if TYPE_CHECKING:  # llguidance is imported where a grammar is first used: an answer without one never loads it
    from llguidance import LLTokenizer

GrammarKind = Literal["json_schema", "lark", "gbnf", "regex"]
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


class GrammarError(ValueError):
    """A grammar or schema that cannot be compiled (the message says why)."""


# llguidance follows a schema's $ref links recursively, about 2 KB of stack a node along a chain: on a thread's
# usual 8 MB a chain of 2,500 bare links, or 500 links of a few nodes each, overflows it and the process dies. So a
# schema may hold at most MAX_SCHEMA_NODES values, and every compile runs on a thread whose stack holds them all.
MAX_SCHEMA_NODES = 50_000
_COMPILE_STACK = 512 << 20  # bytes of the compiling thread's stack (address space: only what is used is committed)
_STACK_SIZE = threading.Lock()
T = TypeVar("T")


def _on_a_deep_stack(fn: Callable[[], T]) -> T:
    """fn() on a thread whose stack holds the deepest schema MAX_SCHEMA_NODES allow; its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller as it is
            out.append((False, e))

    with _STACK_SIZE:  # the size is the process's: set, used and put back by one compile at a time
        before = threading.stack_size(_COMPILE_STACK)
        try:
            thread = threading.Thread(target=run, name="grammar-compile", daemon=True)
            thread.start()
        finally:
            threading.stack_size(before)
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def check_schema_size(schema: Any) -> None:
    """GrammarError where a schema holds more than MAX_SCHEMA_NODES values (objects, arrays, and their leaves),
    counted without recursion, so no nesting depth can overflow the count itself."""
    stack, nodes = [schema], 0
    while stack:
        value = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise GrammarError(f"the schema is too large (more than {MAX_SCHEMA_NODES:,} values)")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def json_schema_grammar(schema: dict[str, Any] | str, *, lenient: bool = False) -> str:
    """llguidance's grammar for JSON that validates against `schema`, laid out compactly. `lenient`: keywords
    llguidance does not implement (propertyNames, say) are left out, the grammar allowing more (a tool's arguments,
    which guide a call) rather than refused (an answer's format, which must validate)."""
    check_schema_size(schema)
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)  # its order is the answer's
    except (RecursionError, ValueError) as e:
        raise GrammarError(f"not a JSON schema: {e}") from None
    return _schema_grammar(text, lenient)


@functools.lru_cache(maxsize=256)
def _schema_grammar(schema: str, lenient: bool) -> str:
    """json_schema_grammar's, once per schema (an agent sends the same tools with every request)."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults={**JSON_LAYOUT, "lenient": lenient})  # type: ignore[arg-type]
    except ValueError as e:
        raise GrammarError(f"not a JSON schema: {e}") from None
    return check_grammar(grammar)


def compile_grammar(kind: GrammarKind, text: str) -> str:
    """llguidance's grammar from a JSON Schema (text), a Lark or GBNF grammar, or a regex."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if kind == "json_schema":
        try:
            return json_schema_grammar(json.loads(text))
        except json.JSONDecodeError as e:
            raise GrammarError(f"the schema is not JSON: {e}") from None
    if kind == "gbnf":
        try:
            text, kind = any_to_lark(text), "lark"
        except Exception as e:  # the converter raises whatever its parser met
            raise GrammarError(f"not a GBNF grammar: {e}") from None
    grammar = LLMatcher.grammar_from_lark(text) if kind == "lark" else LLMatcher.grammar_from_regex(text)
    return check_grammar(grammar)


def check_grammar(grammar: str, tokenizer: LLTokenizer | None = None) -> str:
    """The grammar, if llguidance accepts it; GrammarError with its reason if not."""
    from llguidance import LLMatcher

    error = _on_a_deep_stack(lambda: LLMatcher.validate_grammar(grammar, tokenizer))
    if error:
        raise GrammarError(error)
    return grammar


class Constraint:
    """One generation's position in a grammar: the mask of allowed tokens, the tokens it forces."""

    def __init__(self, tokenizer: LLTokenizer, grammar: str, n_vocab: int) -> None:
        from llguidance import LLMatcher

        self.matcher = _on_a_deep_stack(lambda: LLMatcher(tokenizer, grammar, log_level=0))
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, np.int32)

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens the grammar allows next."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar forbids at -inf."""
        allowed = self.allowed()
        if not allowed.any():
            raise GrammarError(f"the grammar allows no token here ({self.matcher.get_error() or 'a dead end'})")
        return np.where(allowed, logits, -np.inf).astype(np.float32)

    def advance(self, token: int) -> None:
        """The output goes on with `token` (one the mask allowed)."""
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} breaks the grammar: {self.matcher.get_error()}")

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only continuation from here (often none)."""
        return list(self.matcher.compute_ff_tokens())

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the start, the grammar allows (nothing is consumed)."""
        n = self.matcher.try_consume_tokens(list(tokens))
        if n:
            self.matcher.rollback(n)
        return n

    def decided(self, tokens: Sequence[int]) -> list[bool]:
        """For each of `tokens` (a valid prefix), whether the grammar allows it alone at its position: there
        the target's choice is known without its logits (nothing is consumed)."""
        out = []
        for tok in tokens:
            allowed = self.allowed()
            out.append(bool(allowed[tok]) and int(np.count_nonzero(allowed)) == 1)
            self.advance(tok)
        if tokens:
            self.matcher.rollback(len(tokens))
        return out
