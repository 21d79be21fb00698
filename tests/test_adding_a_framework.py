"""docs/adding-a-framework.md's example, as written there: a NumPy adapter of one's own, data
parallel through the job's store, measured on one and two ranks; its fsdp cases skip naming what
it runs (issue 54: the page walks a complete example that a test runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.alone(
    "its recording takes the 1n2d case's scaling efficiency from timings beside its 1n1d")


def page_files() -> dict[str, str]:
    """docs/adding-a-framework.md's python blocks, by the file each names on its first line."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "adding-a-framework.md").read_text()
    return dict(re.findall(r"```python\n# (\S+\.py)\n(.*?)```", page, re.S))


# Appended to the page's adapter by the test: each rank writes, as it closes, how many steps it
# took and a digest of its weights.
LOGGED_CLOSE = '''
import hashlib, os

_close = NumpyTrainer.close


def _logged(self):
    digest = hashlib.sha256(self.weights.tobytes()).hexdigest()
    with open(os.environ["NUMPY_LOG"], "a") as log:
        log.write(json.dumps([self.dist.world_size, self.dist.rank, self.steps, digest]) + "\\n")
    _close(self)


NumpyTrainer.close = _logged
'''


@pytest.mark.usefixtures("subprocess_env")
def test_the_docs_example_framework_trains_data_parallel_and_skips_what_it_does_not_run(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    files = page_files()
    assert sorted(files) == ["numpy_adapter.py", "test_numpy_model.py"]
    for name, text in files.items():
        (pytester.path / name).write_text(text)
    with (pytester.path / "numpy_adapter.py").open("a") as adapter:
        adapter.write(LOGGED_CLOSE)
    log = pytester.path / "numpy.log"
    monkeypatch.setenv("NUMPY_LOG", str(log))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-launches", "1",
        "--dlperf-repeats", "1", "--dlperf-unstable-cv", "100", "--devices-per-node", "2",
        "--dlperf-update-baselines", "--dlperf-json", "r.json", "-rs", timeout=600)
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*numpy_adapter cannot run layout fsdp2 on cpu: the numpy_adapter "
                                 "adapter has no strategy for layout kind 'fsdp' (it runs data "
                                 "parallelism only)*"])
    cases = {b["name"]: b["extra_info"] for b in
             json.loads((pytester.path / "r.json").read_text())["benchmarks"]}
    assert sorted(cases) == ["test_regression[1n1d]", "test_regression[1n2d]"]
    assert cases["test_regression[1n2d]"]["global_batch"] == 2 * 64
    import numpy

    fingerprint = cases["test_regression[1n2d]"]["fingerprint"]
    assert (fingerprint["framework"], fingerprint["framework_version"]) == (
        "numpy_adapter", numpy.__version__)  # DISTRIBUTION's version
    # Every launch's ranks closed after the same steps with the same weights, though each rank
    # drew a batch of its own: they stepped with the mean gradient. The lone rank's differ.
    closed: dict[tuple[int, int], set[tuple[int, str]]] = {}
    for world, rank, steps, digest in map(json.loads, log.read_text().splitlines()):
        closed.setdefault((world, rank), set()).add((steps, digest))
    two = closed[(2, 0)] | closed[(2, 1)]
    assert len(closed[(2, 0)]) == len(two), closed  # rank 1 ended as rank 0 did, launch by launch
    assert not two & closed[(1, 0)], closed
