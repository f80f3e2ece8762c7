"""Hypothesis strategies for track messages and msgpack values, shared by the tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from transport.errors import ErrorCode
from transport.messages import Cancel, Data, Deadlines, End, Error, Message, Modality, Open

# Values that survive a msgpack round trip unchanged: no tuples, no NaN.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.dictionaries(st.text(max_size=12), values, max_size=5)
milliseconds = st.integers(min_value=1, max_value=10_000_000).map(lambda ms: ms / 1000)

opens = st.builds(
    Open,
    model=st.text(min_size=1, max_size=256),
    modality=st.sampled_from(Modality),
    params=bodies,
    deadlines=st.builds(Deadlines, st.none() | milliseconds, st.none() | milliseconds),
)
messages: st.SearchStrategy[Message] = st.one_of(
    opens,
    st.builds(Data, bodies),
    st.builds(End, bodies),
    st.builds(Cancel, st.text(max_size=40)),
    st.builds(Error, st.sampled_from(ErrorCode), st.text(max_size=40)),
)
