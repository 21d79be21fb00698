"""Protocol arithmetic: properties over many inputs, plus the named profiles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_dlperf.core import protocol
from pytest_dlperf.core.protocol import Protocol, aggregate, resolve, throughput

counts = st.integers(min_value=1, max_value=10_000)
seconds = st.floats(min_value=1e-4, max_value=1e4, allow_nan=False)


def test_full_profile_is_dlperf() -> None:
    assert (protocol.FULL.warmup_steps, protocol.FULL.steps, protocol.FULL.repeats) == (20, 100, 7)
    assert resolve("full") is protocol.FULL


@given(batch=counts, steps=counts, elapsed=seconds)
def test_throughput_times_elapsed_is_samples(batch: int, steps: int, elapsed: float) -> None:
    assert throughput(batch, steps, elapsed) * elapsed == pytest.approx(batch * steps)


@given(batch=counts, steps=counts, elapsed=seconds, factor=st.floats(1.01, 100))
def test_slower_window_means_lower_throughput(batch: int, steps: int, elapsed: float,
                                              factor: float) -> None:
    assert throughput(batch, steps, elapsed * factor) < throughput(batch, steps, elapsed)


@given(st.lists(st.floats(0.1, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_median_lies_between_min_and_max(values: list[float]) -> None:
    assert min(values) <= protocol.median(values) <= max(values)
    assert protocol.median(values) == protocol.median(list(reversed(values)))


@given(st.integers(0, 100), st.integers(1, 1000), st.integers(1, 50))
def test_total_steps(warmup: int, steps: int, repeats: int) -> None:
    assert Protocol(warmup, steps, repeats).total_steps == warmup + steps * repeats


@given(warmup=st.none() | st.integers(0, 50), steps=st.none() | st.integers(1, 500),
       repeats=st.none() | st.integers(1, 20))
def test_explicit_counts_override_the_profile(warmup: int | None, steps: int | None,
                                              repeats: int | None) -> None:
    got = resolve("quick", warmup, steps, repeats)
    assert got.warmup_steps == (protocol.QUICK.warmup_steps if warmup is None else warmup)
    assert got.steps == (protocol.QUICK.steps if steps is None else steps)
    assert got.repeats == (protocol.QUICK.repeats if repeats is None else repeats)


@pytest.mark.parametrize("args", [(-1, 10, 1), (0, 0, 1), (0, 10, 0)])
def test_invalid_protocols_are_refused(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        Protocol(*args)


def _rank(elapsed: list[float], steps: int = 10) -> dict[str, object]:
    return {"warmup_s": 1.0, "windows": [{"steps": steps, "elapsed_s": e} for e in elapsed]}


@given(st.lists(st.lists(seconds, min_size=3, max_size=3), min_size=1, max_size=8),
       st.integers(1, 256))
def test_aggregate_uses_the_slowest_rank_and_the_global_batch(
        per_rank: list[list[float]], batch: int) -> None:
    result = aggregate([_rank(e) for e in per_rank], batch, wall_s=5.0)
    world = len(per_rank)
    assert result.global_batch == batch * world
    for i, rate in enumerate(result.samples_per_s):
        slowest = max(r[i] for r in per_rank)
        assert rate == pytest.approx(batch * world * 10 / slowest)
    assert result.min <= result.median <= result.max
    assert result.timed_steps == 30


def test_aggregate_refuses_ranks_that_disagree() -> None:
    with pytest.raises(ValueError, match="different numbers of windows"):
        aggregate([_rank([1.0, 1.0]), _rank([1.0])], 2, wall_s=1.0)
