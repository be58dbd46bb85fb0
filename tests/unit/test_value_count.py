"""The guard's count of a body's JSON values as it arrives, piece by piece: exact for any JSON cut anywhere."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.frontends.server.guard import ValueCount

TEXT = st.text(alphabet=st.sampled_from(['"', "\\", ",", "{", "[", "a", "é", "\n", "u"]), max_size=6)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


def values(v: Any) -> int:
    """What a parse makes: an object or array, and a separator between its members."""
    if isinstance(v, dict | list):
        members = list(v.values()) if isinstance(v, dict) else v
        return 1 + max(len(members) - 1, 0) + sum(values(m) for m in members)
    return 0


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans(), st.lists(st.integers(1, 9), min_size=1))
def test_a_body_cut_anywhere_counts_as_parsed(value: Any, ascii_only: bool, cuts: list[int]) -> None:
    body, count, at = json.dumps(value, ensure_ascii=ascii_only).encode(), ValueCount(), 0
    for i in range(len(body)):  # the pieces' lengths cycle through `cuts`: escapes and quotes cut at every place
        if at >= len(body):
            break
        count.feed(body[at : at + cuts[i % len(cuts)]])
        at += cuts[i % len(cuts)]
    assert count.values == values(value)
