"""The CUDA paths, run for real on an NVIDIA GPU: NVML's facts, each installed framework's 1n1d
fp32 and AMP cases (quick profile), the fingerprint's CUDA stack, synchronization at window
boundaries, and torch's fast path (channels_last, cuDNN autotuning, no host sync in a step).

Each framework's training runs in its own process (its worker interpreter for OneFlow), as
a rank would: TensorFlow maps GPU memory at start-up and would starve the others in one process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snippets import WINDOW_AGAINST_A_CLOCK, oneflow_interpreter, run_snippet

from pytest_dlperf.core.topology import detect_hardware
from pytest_dlperf.plugin.adapters import Adapter

FRAMEWORKS = ("torch", "tensorflow", "oneflow")
STACK = re.compile(r"^cuda\d+\.\d+-cudnn\d+-nccl\d+\.\d+\.\d+-driver\d+\.\d+")


def worker_python(framework: str) -> str:
    """The interpreter the framework's ranks run under, or a skip saying what is missing."""
    adapter = Adapter.resolve(framework)
    if framework == "oneflow":
        python = oneflow_interpreter()
        if not os.access(python, os.X_OK):
            pytest.skip(f"no OneFlow interpreter at {python}: run scripts/setup-oneflow")
        version = adapter.installed_version(str(python))
    else:
        python, version = Path(sys.executable), adapter.installed_version()
    if version is None:
        pytest.skip(f"{framework} is not installed for {python}; {adapter.install_hint}")
    return str(python)


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, worker_python(request.param)


def test_nvml_reports_name_memory_and_driver_as_nvidia_smi_does() -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH: nothing independent to check NVML against")
    hardware = detect_hardware()
    lines = subprocess.run(
        [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()
    rows = [[field.strip() for field in line.split(",")] for line in lines]
    assert list(hardware.gpus) == [name for name, _, _ in rows]
    # nvidia-smi prints MiB, rounded down; NVML gives bytes.
    assert [m // 2**20 for m in hardware.gpu_memory] == [int(mib) for _, mib, _ in rows]
    assert all(m > 2**30 for m in hardware.gpu_memory)
    assert hardware.gpu_driver == rows[0][2]
    assert hardware.device_type == "cuda"


@pytest.mark.usefixtures("subprocess_env")
def test_quick_fp32_and_amp_cases_train_and_fingerprint_the_cuda_stack(
        pytester: pytest.Pytester, framework: tuple[str, str]) -> None:
    name, python = framework
    pytester.makepyfile(test_gpu_case=f"""
        def test_case(cluster, amp, throughput_meter):
            throughput_meter.measure({name!r})
    """)
    pythons = ("--dlperf-python", f"oneflow={python}") if name == "oneflow" else ()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--dlperf-protocol", "quick", "--dlperf-baselines", "bl",
        "--dlperf-json", "r.json", "--dlperf-device", "cuda", "--dlperf-compilers", "eager",
        "--dlperf-timeout", "900", "-k", "1n1d", *pythons, timeout=1200)
    # A case whose loss went NaN/inf fails as diverged, so two passes are two finite runs.
    result.assert_outcomes(passed=2)
    benches = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert sorted(b["extra_info"]["precision"] for b in benches) == ["amp(float16)", "fp32"]
    gpu = detect_hardware().gpus[0]
    for bench in benches:
        info = bench["extra_info"]
        fp, env = info["fingerprint"], info["environment"]
        assert fp["device_type"] == "cuda" and fp["device_model"] == gpu
        assert STACK.match(fp["accelerator_stack"]), fp["accelerator_stack"]
        assert env["gpu_memory_bytes"] and env["driver"]
        assert info["samples_per_s"] > 0
    assert {b["extra_info"]["batch_size"] for b in benches} == {128, 256}  # DLPerf's sizes


SPEC = """
from pytest_dlperf.frameworks import DistEnv
from pytest_dlperf.models import RESNET50
from pytest_dlperf.core.protocol import QUICK
from pytest_dlperf.core.spec import spec_for
from pytest_dlperf.rank.worker import build
spec = spec_for(FRAMEWORK, RESNET50, protocol=QUICK, device_type="cuda", precision=PRECISION,
                batch_size=256).with_(threads=4)
trainer = build(spec, DistEnv(0, 1, 0, 1, 0))
for _ in range(5):  # cuDNN autotuning, allocator growth, tracing
    trainer.step()
trainer.synchronize()
"""


def test_a_window_waits_for_the_gpu(framework: tuple[str, str]) -> None:
    """A step returns once its kernels are queued. The meter's window must cover their
    execution: it agrees with a wall clock read after a blocking fetch of the loss. The same
    window with a no-op synchronize is far shorter (the control: proves the step really is
    asynchronous, so the first check can fail). One step a window: the launch queue holds
    about one ResNet-50 step, so with more the host would stall on a full queue and the
    control would read almost the whole time."""
    name, python = framework
    figures = run_snippet(python, f"FRAMEWORK, PRECISION, STEPS = {name!r}, 'fp32', 1\n" + SPEC
                          + WINDOW_AGAINST_A_CLOCK, timeout=600)
    assert isinstance(figures, dict)
    window, outside = figures["synchronized"]
    assert 0.9 * outside <= window <= outside, figures
    unsynced_window, unsynced_outside = figures["not synchronized"]
    assert unsynced_window < 0.5 * unsynced_outside, figures


@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_torch_steps_in_channels_last_with_cudnn_autotuning_and_no_host_sync(
        precision: str) -> None:
    """What a real user's ResNet-50 gets: channels_last tensors, cuDNN's autotuner, and not
    one device-to-host synchronization inside a step (torch's sync debug mode raises on any;
    an unfused optimizer under GradScaler would read found_inf on the host every step)."""
    python = worker_python("torch")
    facts = run_snippet(python, f"FRAMEWORK, PRECISION = 'torch', {precision!r}\n" + SPEC + """
import json, torch
model = trainer.model.module if hasattr(trainer.model, "module") else trainer.model
facts = {
    "images_channels_last": trainer.inputs.is_contiguous(memory_format=torch.channels_last),
    "conv1_channels_last": model.conv1.weight.is_contiguous(memory_format=torch.channels_last),
    "cudnn_benchmark": torch.backends.cudnn.benchmark,
}
torch.cuda.set_sync_debug_mode("error")
try:
    for _ in range(3):
        trainer.step()
    facts["synchronizing_call"] = None
except RuntimeError as exc:
    facts["synchronizing_call"] = str(exc)
torch.cuda.set_sync_debug_mode("default")
facts["loss"] = trainer.loss()
print(json.dumps(facts))
""", timeout=600)
    assert facts == {"images_channels_last": True, "conv1_channels_last": True,
                     "cudnn_benchmark": True, "synchronizing_call": None,
                     "loss": pytest.approx(facts["loss"])}
    assert 0 < facts["loss"] < 100
