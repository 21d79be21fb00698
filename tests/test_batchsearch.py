"""--dlperf-batch-size max's search on numbers alone: a memory that fits batches up to a limit."""

from __future__ import annotations

import pytest

from pytest_dlperf.core.batchsearch import BatchSearchError, Probe, search


def memory(limit: int, calls: list[int]):  # noqa: ANN201 - a probe
    def fits(batch: int) -> Probe:
        calls.append(batch)
        return Probe(batch, batch <= limit, 1.0, "" if batch <= limit else "out of memory")

    return fits


@pytest.mark.parametrize("limit", [1, 2, 3, 37, 64, 65, 1000])
@pytest.mark.parametrize("start", [1, 8, 50])
def test_the_found_batch_fits_and_one_more_does_not(limit: int, start: int) -> None:
    calls: list[int] = []
    found = search(memory(limit, calls), start)
    assert found.found == limit
    assert limit in calls and limit + 1 in calls  # both sides of the edge were probed
    assert len(calls) == len(set(calls))  # no batch probed twice


def test_doubling_then_bisection_from_below() -> None:
    calls: list[int] = []
    found = search(memory(37, calls), 4)
    assert calls == [4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert found.seconds == 10.0 and not found.seeded


def test_a_start_that_does_not_fit_halves_first() -> None:
    calls: list[int] = []
    assert search(memory(5, calls), 64).found == 5
    assert calls[:5] == [64, 32, 16, 8, 4]


def test_an_earlier_answer_settles_in_two_probes_when_nothing_changed() -> None:
    calls: list[int] = []
    found = search(memory(37, calls), 37, seeded=True)
    assert (found.found, calls) == (37, [37, 38])


def test_an_earlier_answer_still_finds_a_grown_limit() -> None:
    calls: list[int] = []
    assert search(memory(50, calls), 37, seeded=True).found == 50
    assert calls[:2] == [37, 38]


def test_even_batch_one_out_of_memory_is_an_error_naming_why() -> None:
    with pytest.raises(BatchSearchError, match="even batch 1 ran out of memory: out of memory"):
        search(memory(0, []), 8)


def test_a_model_that_fits_everything_stops_at_the_cap() -> None:
    calls: list[int] = []
    found = search(memory(10**9, calls), 4, cap=100)
    assert (found.found, found.capped) == (64, True)
    assert max(calls) == 64


def test_a_measurement_out_of_memory_at_the_found_batch_steps_one_down_and_says_so() -> None:
    found = search(memory(37, []), 4)
    assert found.retreat(12.5, "out of memory at 37") == 36
    assert found.found == 36
    last = found.probes[-1].to_json()
    assert last == {"batch": 37, "fits": False, "seconds": 12.5, "message": "out of memory at 37",
                    "stage": "measurement"}
    assert found.seconds == 10 * 1.0 + 12.5  # the measurement's time counts as the search's


def test_each_retreat_steps_twice_as_far_then_memory_not_steady_stops_it() -> None:
    # Memory at the edge moves between launches by more than one resolution of a size: each
    # step down is twice the last, so that a few measurements reach below that jitter.
    found = search(memory(37, []), 4)
    assert [found.retreat(1.0, "oom") for _ in range(4)] == [36, 34, 30, 22]
    with pytest.raises(BatchSearchError, match=r"found 37, but the measurement ran out of memory "
                                               r"at batch 37, 36, 34, 30, 22 .*not steady.*oom"):
        found.retreat(1.0, "oom")


def test_no_retreat_below_batch_one() -> None:
    found = search(memory(1, []), 1)
    with pytest.raises(BatchSearchError, match="found 1, but .* at batch 1 "):
        found.retreat(1.0, "oom")


@pytest.mark.parametrize("limit", [85_744, 1_000_000, 2_345_678])
def test_another_size_is_found_to_within_its_precision_in_few_probes(limit: int) -> None:
    calls: list[int] = []
    found = search(memory(limit, calls), 85_744, size="num_classes")
    assert found.precision == 1 / 64 and found.size == "num_classes"
    # What was found fits, and within its precision of it one more step did not.
    assert found.found <= limit < found.found + found.step(found.found) + 1
    assert limit - found.found <= found.found / 64
    assert len(calls) <= 16  # bisected to 1/64, not to the class
    assert found.to_json()["probes"][0] == {"value": 85_744, "fits": True, "seconds": 1.0,
                                            "message": "", "stage": "probe"}
    assert found.to_json()["size"] == "num_classes"


def test_another_size_retreats_by_its_precision_and_names_itself() -> None:
    found = search(memory(1_000_000, []), 100_000, size="vocab")
    before = found.found
    assert found.retreat(1.0, "oom") == before - before // 64
    with pytest.raises(BatchSearchError, match="even vocab=1 ran out of memory: out of memory"):
        search(memory(0, []), 100_000, size="vocab")
    retreating = search(memory(1_000_000, []), 100_000, size="vocab")
    first, step = retreating.found, retreating.step(retreating.found)
    # By the found value's resolution: one, then two, four and eight of them.
    assert [retreating.retreat(1.0, "oom") for _ in range(4)] == [
        first - step, first - 3 * step, first - 7 * step, first - 15 * step]
    with pytest.raises(BatchSearchError, match=r"found \d+, but the measurement ran out of "
                                               r"memory at vocab=\d+, \d+, \d+, \d+, \d+ "):
        retreating.retreat(1.0, "oom")


def test_a_spent_budget_stops_the_search_at_the_largest_value_that_fitted() -> None:
    """Issue 74: nothing capped a search (InsightFace's class search under a 3G limit: 263 s of
    probes, 19.5 minutes with its measurements). Each probe here takes 1 s: after 5 s the
    search stops where it stands, the largest fit found and the smallest failure said."""
    calls: list[int] = []
    found = search(memory(37, calls), 4, budget_s=5.0)
    assert calls == [4, 8, 16, 32, 64]  # doubling, then the budget (5 probes, 5 s)
    assert (found.found, found.budget_spent, found.unsettled) == (32, True, 64)
    record = found.to_json()
    assert (record["budget_s"], record["budget_spent"], record["unsettled"]) == (5.0, True, 64)
    # a budget the search does not reach changes nothing
    assert search(memory(37, []), 4, budget_s=100.0).found == 37
    # a budget spent before any value fitted does not stop it (it has nothing to give yet):
    # it halves to the first fit, 2, and stops there
    going: list[int] = []
    halved = search(memory(3, going), 64, budget_s=1.0)
    assert going == [64, 32, 16, 8, 4, 2]
    assert (halved.found, halved.budget_spent, halved.unsettled) == (2, True, 4)


def test_the_notes_under_the_table_say_what_a_search_found_and_how() -> None:
    from pytest_dlperf.report.tables import search_notes

    spent = search(memory(37, []), 4, budget_s=5.0).to_json()
    settled = search(memory(3000, []), 1000, size="classes",
                     precision=1 / 64).to_json()
    settled["probes"].append({"value": 3000, "fits": False, "seconds": 9.0, "message": "oom",
                              "stage": "measurement, rerun"})
    notes = search_notes([{"extra_info": {"case": "t[1n1d]", "batch_search": spent}},
                          {"extra_info": {"case": "t[1n2d]", "size_search": settled}}])
    assert notes[0] == ("pytest-dlperf: t[1n1d]: --dlperf-batch-size max found batch 32 in 5 "
                        "probe(s), 5 s; the search's budget (5 s, --dlperf-search-budget) ran "
                        "out: the largest that fitted, 64 did not")
    assert notes[1].startswith(f"pytest-dlperf: t[1n2d]: --dlperf-size classes=max found "
                               f"classes {settled['found']:,} in ")
    assert notes[1].endswith("; 1 launch(es) ran out of memory there and ran again, the "
                             "launches that fitted kept")
