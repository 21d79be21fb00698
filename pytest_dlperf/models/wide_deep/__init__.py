"""Wide & Deep (DLPerf's click-through-rate special case): per-iteration latency and memory as its
embedding tables grow, measured in samples/s with the iteration's latency beside it.

The model of DLPerf's scripts (OneFlow's ``WideDeepLearning``, HugeCTR's ``wdl``): 13 dense
features; 26 deep sparse slots looked up in one deep table of ``vocab`` rows and ``deep_width``
columns; 2 wide slots looked up in one wide table of ``vocab`` rows and one column (the same
vocabulary for both, as DLPerf's scripts pass it); the deep slots' vectors, concatenated with the
dense features, go through ``hidden_layers`` x [Linear(``hidden_size``), ReLU, Dropout(0.5)] to
one logit, the wide slots' weights summed to another; their sum is trained against a click label
with sigmoid cross-entropy, Adam at lr 1e-3. Tables are initialized uniform in (-0.05, 0.05), the
tower Xavier-uniform with zero biases.

The ids are synthetic, drawn afresh every step: a power law over each table's rows (Zipf-like,
exponent ``zipf`` 1.1, HugeCTR's generator's "medium" skew, as click logs are skewed), each slot's
hot rows scattered over the table by an affine map of its own, seeded by the case's seed and the
rank. The rows one step touches (at most batch x 28) do not grow with the table.

Sizes: on CUDA DLPerf's (batch 16,384 per device, width 16, 7 x 1024, vocabulary 3.2M, the first
rung of its ladder); on CPU width 16, 2 x 1024, batch 512, vocabulary 200k (the CPU ladder runs
200k..3.2M:x2). ``vocab`` is the size a sweep varies.

torch's recipe is in ``torch``; this module holds the sizes, the arithmetic (parameters,
the bytes a row costs) and the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...core.workload import AdamW, SizeValue, Workload, WorkloadError

CUDA_SIZES: dict[str, SizeValue] = {
    "vocab": 3_200_000, "deep_width": 16, "hidden_size": 1024, "hidden_layers": 7,
    "dense_fields": 13, "deep_slots": 26, "wide_slots": 2, "dropout": 0.5, "zipf": 1.1}
CPU_SIZES: dict[str, SizeValue] = {**CUDA_SIZES, "vocab": 200_000, "hidden_layers": 2}
# The CPU ladder of the issue: doubling from 200k rows to 3.2M (under a GB with Adam's state).
CPU_LADDER = "200k..3.2M:x2"
CUDA_LADDER = "3.2M..51.2M:x2"  # DLPerf's 1n1g ladder, up to where OneFlow ran out on a V100
# Each slot's hot rows are scattered over its table by id -> (id * SCATTER + offset) mod rows:
# SCATTER is a prime, so the map is a permutation of the rows wherever it does not divide them.
SCATTER = 1_000_003


@dataclass(frozen=True)
class WideDeepShape:
    """A Wide & Deep model's dimensions, read from a case's sizes."""

    vocab: int
    deep_width: int
    hidden_size: int
    hidden_layers: int
    dense_fields: int
    deep_slots: int
    wide_slots: int
    dropout: float
    zipf: float

    @classmethod
    def of(cls, sizes: Mapping[str, SizeValue]) -> WideDeepShape:
        def whole(name: str) -> int:
            value = sizes[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"wide_deep: size {name!r} must be a positive integer, got "
                                    f"{value!r}")
            return value

        dropout, zipf = float(sizes["dropout"]), float(sizes["zipf"])
        if not 0 <= dropout < 1:
            raise WorkloadError(f"wide_deep: dropout must be in [0, 1), got {dropout}")
        if not zipf > 0:
            raise WorkloadError(f"wide_deep: zipf (the ids' power-law exponent) must be > 0, "
                                f"got {zipf}")
        shape = cls(whole("vocab"), whole("deep_width"), whole("hidden_size"),
                    whole("hidden_layers"), whole("dense_fields"), whole("deep_slots"),
                    whole("wide_slots"), dropout, zipf)
        if shape.vocab % SCATTER == 0:
            raise WorkloadError(f"wide_deep: vocab {shape.vocab} is a multiple of {SCATTER}, "
                                "the prime that scatters the hot rows; take another")
        return shape

    @property
    def tower_input(self) -> int:
        return self.deep_slots * self.deep_width + self.dense_fields

    @property
    def embedding_parameters(self) -> int:
        """The deep table's and the wide table's: vocab x (width + 1)."""
        return self.vocab * (self.deep_width + 1)

    @property
    def dense_parameters(self) -> int:
        """The tower's and the deep logit's layers, weights and biases."""
        h = self.hidden_size
        return (self.tower_input * h + h + (self.hidden_layers - 1) * (h * h + h) + h + 1)

    @property
    def parameters(self) -> int:
        return self.embedding_parameters + self.dense_parameters


def parameter_count(sizes: Mapping[str, SizeValue]) -> int:
    return WideDeepShape.of(sizes).parameters


def bytes_per_row(sizes: Mapping[str, SizeValue], copies: int = 4, bytes_each: int = 4,
                  shards: int = 1) -> float:
    """What one vocabulary row costs a rank: its deep and wide entries (width + 1 numbers) times
    the copies kept of each (the weight, its dense gradient, Adam's two moments: 4; a sparse or
    lazy update keeps no dense gradient: 3), over the ranks a plan spreads the tables on."""
    shape = WideDeepShape.of(sizes)
    return (shape.deep_width + 1) * copies * bytes_each / shards


def bytes_per_row_held(sizes: Mapping[str, SizeValue], tables: Mapping[str, list[list[int]]],
                       copies: int = 4, bytes_each: int = 4) -> float:
    """What one vocabulary row costs the rank that holds the most of the tables under an
    ``emb`` plan, from the shards the results name (``sharded_modules["emb"]["tables"]``:
    ``[rank, first row, first column, rows, columns]`` each, rank -1 for a table on every
    rank): the share of a row's numbers each rank holds, times ``copies`` (``bytes_per_row``)."""
    vocab = WideDeepShape.of(sizes).vocab
    held: dict[int, float] = {}
    for shards in tables.values():
        for rank, _, _, rows, columns in shards:
            if rank < 0:
                return bytes_per_row(sizes, copies, bytes_each)
            held[rank] = held.get(rank, 0.0) + rows * columns / vocab
    return max(held.values()) * copies * bytes_each


WORKLOAD = Workload(
    name="wide_deep",
    unit="samples",
    batch_size={"cuda": 16_384, "cpu": 512},
    sizes={name: (CUDA_SIZES[name] if CUDA_SIZES[name] == CPU_SIZES[name]
                  else {"cuda": CUDA_SIZES[name], "cpu": CPU_SIZES[name]})
           for name in CUDA_SIZES},
    optimizer=AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    recipes={"torch": "pytest_dlperf.models.wide_deep.torch:recipe",
             "oneflow": "pytest_dlperf.models.wide_deep.oneflow:recipe",
             "tensorflow": "pytest_dlperf.models.wide_deep.tensorflow:recipe",
             "paddle": "pytest_dlperf.models.wide_deep.paddle:recipe"},
    # emb: the tables sharded over the ranks by a plan (emb-tw, emb-cw, ...; docs/sweeps.md)
    layouts=("dp", "emb"),
)
