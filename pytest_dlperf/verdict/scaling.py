"""The scaling model, held against a multi-device case's measured efficiency: from one device's
phases, the gradients' bytes and the link, the step on N devices (pure arithmetic, no I/O).

A ring all-reduce of B bytes over N ranks sends and receives 2(N-1)/N x B per rank; with a
per-collective latency L over K buckets, it takes ``2(N-1)/N x B / bandwidth + K x L``. The
part the step waits for is what the framework does not hide behind backward: the measured
overlap (hidden / total communication, ``core.phases``) leaves ``(1 - overlap)`` of it
exposed. The N-device step is then one device's step plus that, and the efficiency one
device's step over it (the per-device batch is the same: DLPerf's weak scaling). On a CPU, a
rank with fewer threads than the one-device run is a smaller device: its compute is taken as
one device's times ``compute_scale`` (the threads' ratio).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..core.phases import EXPOSED, REST, Phases

# A measured efficiency below the model's divided by this warns, naming what is out of line
# (docs/phases.md "The scaling model").
OUT_OF_LINE = 1.5
# A phase of the N-device step counts as out of line when it exceeds one device's by this
# much and by this part of one device's step.
PHASE_FACTOR = 1.25
PHASE_OF_STEP = 0.05


def ring_seconds(gradient_bytes: float, devices: int, bandwidth_bps: float,
                 latency_s: float = 0.0, buckets: int = 1) -> float:
    """A ring all-reduce's time: 2(N-1)/N x bytes at the link's bit rate, plus the buckets'
    latency."""
    if devices < 2:
        return 0.0
    return (2 * (devices - 1) / devices * gradient_bytes * 8 / bandwidth_bps
            + max(1, buckets) * latency_s)


@dataclass(frozen=True)
class ScalingModel:
    """The prediction, with every figure it came from."""

    devices: int
    one_device_step_s: float  # one device's phases, summed
    compute_scale: float  # a rank's compute over one device's (CPU: the threads' ratio)
    gradient_bytes: int
    bandwidth_bps: float
    bandwidth_source: str  # "the link measured", "--dlperf-link", "the NIC", ...
    latency_s: float
    buckets: int
    overlap: float  # the N-device run's measured hidden / total communication
    communication_s: float  # the ring's predicted time
    exposed_s: float  # the part of it left exposed
    predicted_step_s: float
    predicted_efficiency: float
    measured_efficiency: float | None = None

    @property
    def ratio(self) -> float | None:
        """Measured over predicted efficiency (1: the model explains the measurement)."""
        if self.measured_efficiency is None or not self.predicted_efficiency:
            return None
        return self.measured_efficiency / self.predicted_efficiency

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "measured_over_predicted": self.ratio}


def predict(one: Phases, many: Phases, devices: int, bandwidth_bps: float | None,
            bandwidth_source: str, measured_efficiency: float | None = None,
            compute_scale: float = 1.0) -> ScalingModel | None:
    """The model for ``devices`` devices from one device's phases (``one``) and the N-device
    run's gradient bytes, latency and overlap (``many``); None without a bandwidth, gradient
    bytes or an overlap (a sharded layout's communication is not separated)."""
    overlap = many.overlap
    if not bandwidth_bps or not many.gradient_bytes or overlap is None or devices < 2:
        return None
    step_1 = one.compute_s
    communication = ring_seconds(many.gradient_bytes, devices, bandwidth_bps,
                                 many.latency_s or 0.0, many.buckets)
    exposed = communication * (1 - overlap)
    predicted = step_1 * compute_scale + exposed
    return ScalingModel(devices, step_1, compute_scale, many.gradient_bytes, bandwidth_bps,
                        bandwidth_source,
                        many.latency_s or 0.0, many.buckets, overlap, communication, exposed,
                        predicted, step_1 / predicted if predicted else 0.0,
                        measured_efficiency)


def out_of_line(model: ScalingModel, one: Phases, many: Phases) -> str | None:
    """A warning where the measured efficiency is below the model's / ``OUT_OF_LINE``, naming
    the phases that are out of line: those that grew beyond one device's, and exposed
    communication beyond the model's; None where the measurement is within it."""
    measured = model.measured_efficiency
    if measured is None or measured * OUT_OF_LINE >= model.predicted_efficiency:
        return None
    grown = []
    for name in many.order:
        if name in (REST, EXPOSED) or name not in one.seconds:
            continue
        before = one.seconds[name] * model.compute_scale
        after = many.seconds[name]
        if after > before * PHASE_FACTOR and after - before > PHASE_OF_STEP * one.compute_s:
            scaled = (f" x {model.compute_scale:.3g} (threads)"
                      if model.compute_scale != 1 else "")
            grown.append(f"{name} {after:.3g} s/step on {model.devices} devices against "
                         f"{one.seconds[name]:.3g}{scaled} on one ({after / before:.2f}x)")
    exposed = many.exposed_s
    if exposed is not None and exposed > model.exposed_s * PHASE_FACTOR and \
            exposed - model.exposed_s > PHASE_OF_STEP * one.compute_s:
        grown.append(f"{EXPOSED} {exposed:.3g} s/step against the model's "
                     f"{model.exposed_s:.3g} ({model.communication_s:.3g} s all-reduce at "
                     f"{model.bandwidth_bps / 1e9:.3g} Gbit/s, {model.overlap:.0%} hidden)")
    where = "; ".join(grown) if grown else "no single phase: the step as a whole"
    return (f"scaling efficiency {measured:.1%} is below the scaling model's "
            f"{model.predicted_efficiency:.1%} by more than {OUT_OF_LINE}x; out of line: "
            f"{where}")
