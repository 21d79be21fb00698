"""The guard of issue 54's seam: every ``perf_tests`` case id, and everything a layout puts in a
case's fingerprint, its id and what ranks are told of it, as they were before layout kinds became
registered entries. A baseline is found by its case id and fingerprint: were either to move, every
team's recorded baselines would stop judging (no error, only "no baseline").

``tests/data/case_ids.json`` was written by this module run as a script (``python
tests/test_case_ids.py > tests/data/case_ids.json``) from the code of bc41004, before the seam; it is never
rewritten to make this test pass: a difference is a change of what users have recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "case_ids.json"

# The collections a user's invocations make: one node, two devices, the multinode ladder, and
# the 2-D and pipeline layouts on four ranks (named, as --dlperf-layouts takes them).
COLLECTIONS = {
    "one node": [],
    "two devices": ["--devices-per-node", "2"],
    "multinode, 2 nodes x 2": ["-m", "multinode", "--nodes", "2", "--devices-per-node", "2"],
    "multinode, 4 nodes x 1": ["-m", "multinode", "--nodes", "4", "--devices-per-node", "1"],
    "layouts on 4 ranks": ["--devices-per-node", "4", "--dlperf-oversubscribe",
                           "--dlperf-layouts", "fsdp2xtp2,dp2xpp2,pp2-gpipe-mb4,tp,fsdp,"
                           "pp-interleaved1f1b,dpxtp2,fsdpxpp2-1f1b-mb8"],
}
# Spellings over world sizes: what the layout makes of each (the fingerprint's part, the wire
# format ranks read, the mesh and every rank's place on it).
SPELLINGS = ("dp", "fsdp", "tp", "pp", "dp2", "fsdp2", "tp2", "pp2", "fsdp2xtp2", "dp2xpp2",
             "tpxfsdp2", "pp2-gpipe", "pp2-1f1b-mb8", "pp2-interleaved1f1b", "dpxtp2",
             "fsdpxpp2-gpipe-mb4", "dp2xfsdp2xtp2", "pp2xtp2xfsdp2")
WORLDS = (1, 2, 4, 8)


def collected(args: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0 and ids, done.stdout[-2000:] + done.stderr[-2000:]
    return ids


def layouts() -> dict[str, Any]:
    from pytest_dlperf.core.parallel import LayoutError, parse_layout

    out: dict[str, Any] = {}
    for text in SPELLINGS:
        for world in WORLDS:
            try:
                layout = parse_layout(text).resolve(world)
            except LayoutError as exc:
                out[f"{text} on {world}"] = {"error": str(exc)}
                continue
            out[f"{text} on {world}"] = {
                "id": layout.id, "fingerprint": layout.fingerprint(),
                "json": layout.to_json(), "kinds": list(layout.kinds),
                "data_parallel": layout.data_parallel,
                "global_batch_of_8": layout.global_batch(8),
                "stage_microbatches": layout.stage_microbatches,
                "mesh": [list(dim) for dim in layout.mesh()],
                "coordinates": [layout.coordinates(rank) for rank in range(world)],
                "data_ranks": [layout.data_rank(rank) for rank in range(world)]}
    return out


def snapshot() -> dict[str, Any]:
    return {"collections": {name: collected(args) for name, args in COLLECTIONS.items()},
            "layouts": layouts()}


def test_case_ids_and_layout_fingerprints_are_what_they_were() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = snapshot()
    for name, ids in golden["collections"].items():
        # Cases added since (a new workload's perf file) record nothing anyone has: every
        # earlier id is still collected, as it was, in its order.
        kept = set(ids)
        assert [i for i in now["collections"][name] if i in kept] == ids, name
    for key, was in golden["layouts"].items():
        assert now["layouts"][key] == was, key
    assert now.keys() == golden.keys()


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    print()
