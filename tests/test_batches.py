"""The batch helpers every adapter shares (``pytest_dlperf.frameworks``): a workload's own
input pipeline restarted at its end, and a nested batch walked leaf by leaf (each adapter moves
its framework's tensors to the device with it)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pytest_dlperf.frameworks import Batches, map_batch

Pair = namedtuple("Pair", "image label")

leaves = st.integers() | st.text(max_size=3) | st.none()
nested = st.recursive(leaves, lambda inner: (
    st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    | st.builds(Pair, inner, inner)), max_leaves=12)


def _shape(value: Any) -> Any:
    """The containers of a batch with every leaf replaced by None."""
    return map_batch(value, lambda leaf: None)


class Moved:
    """A leaf as the device holds it."""

    def __init__(self, value: Any) -> None:
        self.value = value


@given(nested)
def test_every_leaf_is_mapped_and_the_containers_are_kept(batch: Any) -> None:
    seen: list[Any] = []
    mapped = map_batch(batch, lambda leaf: seen.append(leaf) or Moved(leaf))
    assert _shape(mapped) == _shape(batch)
    assert map_batch(mapped, lambda leaf: leaf.value) == batch  # each leaf came through once
    assert type(mapped) is type(batch) or not isinstance(batch, (tuple, list, dict))
    assert len(seen) == len(_leaves(batch))


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def test_a_named_tuple_stays_named() -> None:
    moved = map_batch(Pair([1, 2], {"y": 3}), lambda leaf: leaf * 10)
    assert moved == Pair([10, 20], {"y": 30}) and moved.image == [10, 20]


def test_batches_start_over_at_the_end_of_the_pipeline() -> None:
    epochs: list[int] = []

    class Loader:
        """Three batches an epoch, counted as a DataLoader's epochs would be."""

        def __iter__(self) -> Any:
            epochs.append(len(epochs))
            return iter([(i, -i) for i in range(3)])

    batches = Batches(Loader())
    got = [batches.next() for _ in range(7)]
    assert got == [(0, 0), (1, -1), (2, -2), (0, 0), (1, -1), (2, -2), (0, 0)]
    assert epochs == [0, 1, 2]


def test_an_empty_pipeline_ends_the_step_instead_of_spinning() -> None:
    batches = Batches([])
    try:
        batches.next()
    except StopIteration:
        return
    raise AssertionError("an empty pipeline gave a batch")
