"""The public fixtures on faked hardware: the topology ladder, AMP per device, bad device counts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from snippets import oneflow_interpreter

from pytest_dlperf.plugin.adapters import Adapter

CASES = """
import pytest

from pytest_dlperf import frameworks
from snippets import oneflow_interpreter

def test_single(cluster, amp):
    print(f"CASE {cluster.nodes}n{cluster.devices_per_node}d {cluster.world_size} "
          f"{cluster.device_type} {cluster.backend} {cluster.topology.device_name!r} "
          f"{cluster.topology.threads_per_worker} {amp.name} {amp.dtype} {amp.loss_scaling}")

@pytest.mark.multinode
def test_scaling(cluster):
    print(f"SCALE {cluster.topology.id} threads={cluster.topology.threads_per_worker}")
"""

A100 = "NVIDIA A100-SXM4-40GB"


def cases(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-s", "-p", "no:randomly", *args)
    assert result.ret == 0, result.stdout.str()
    return [line.split("CASE ", 1)[1] for line in result.outlines if "CASE " in line]


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("--collect-only", "-q", *args)
    assert result.ret == 0, result.stdout.str()
    return [line.split("::")[1] for line in result.outlines if "::" in line]


def test_eight_gpus_give_dlperf_1n1d_and_1n8d(pytester: pytest.Pytester,
                                              fake_hardware: Callable[..., object]) -> None:
    fake_hardware(gpus=(A100,) * 8, cpu_count=64, driver="550.54")
    assert cases(pytester, "-k", "single") == [
        f"1n1d 1 cuda nccl '{A100}' 64 fp32 float32 False",
        f"1n1d 1 cuda nccl '{A100}' 64 amp float16 True",
        f"1n8d 8 cuda nccl '{A100}' 8 fp32 float32 False",
        f"1n8d 8 cuda nccl '{A100}' 8 amp float16 True",
    ]


def test_cpu_simulates_devices_with_processes_sharing_the_cores(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_model="Fake CPU 9000", cpu_count=2, cpu_bf16=True)
    assert cases(pytester, "-k", "single") == [
        "1n1d 1 cpu gloo 'Fake CPU 9000' 2 fp32 float32 False",
        "1n1d 1 cpu gloo 'Fake CPU 9000' 2 amp bfloat16 False",
        "1n2d 2 cpu gloo 'Fake CPU 9000' 1 fp32 float32 False",
        "1n2d 2 cpu gloo 'Fake CPU 9000' 1 amp bfloat16 False",
    ]


def test_multinode_ladder_goes_up_to_nodes(pytester: pytest.Pytester,
                                           fake_hardware: Callable[..., object]) -> None:
    fake_hardware(gpus=(A100,) * 8, cpu_count=64)
    names = collected(pytester, "-m", "multinode", "--nodes", "4")
    assert names == ["test_scaling[1n1d]", "test_scaling[1n8d]", "test_scaling[2n8d]",
                     "test_scaling[4n8d]"]
    names = collected(pytester, "-m", "multinode", "--nodes", "3", "--devices-per-node", "2")
    assert names == ["test_scaling[1n1d]", "test_scaling[1n2d]", "test_scaling[2n2d]",
                     "test_scaling[3n2d]"]


def test_scaling_cases_wait_for_multinode_or_more_nodes(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_count=4)
    assert not any(n.startswith("test_scaling") for n in collected(pytester))
    assert collected(pytester, "-m", "multinode") == ["test_scaling[1n1d]", "test_scaling[1n2d]"]
    assert [n for n in collected(pytester, "--nodes", "2") if n.startswith("test_scaling")] == [
        "test_scaling[1n1d]", "test_scaling[1n2d]", "test_scaling[2n2d]"]



def test_multinode_deselecting_every_perf_case_says_why(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    """``-m multinode --nodes 2`` on a file without the marker deselected everything and
    exited 5 without a hint."""
    fake_hardware(cpu_count=4)
    pytester.makepyfile(test_plain="def test_single(cluster, amp):\n    pass\n")
    result = pytester.runpytest("-m", "multinode", "--nodes", "2")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([
        "*pytest-dlperf: -m multinode deselected every perf case (4): no perf case has the "
        "multinode marker; mark scaling tests with @pytest.mark.multinode*"])
    # Where a case has the marker, or -m does not ask for it, nothing is said.
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-m", "multinode", "--collect-only")
    assert result.ret == 0
    result.stdout.no_fnmatch_line("*no perf case has the multinode marker*")
    result = pytester.runpytest("-m", "not multinode", "--collect-only", "test_plain.py")
    result.stdout.no_fnmatch_line("*no perf case has the multinode marker*")

def test_on_cpu_local_nodes_get_no_more_ranks_than_the_host_has_cores(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    """``pytest perf_tests -m multinode --nodes 4`` on a 2-core host used to run 4 nodes x 2
    single-thread ranks (8 ranks on 2 cores; its torch cases alone took over 15 minutes).
    Local nodes share the host, so the default devices per node is cores / nodes (at least 1,
    at most 2); --devices-per-node still overrides it."""
    fake_hardware(cpu_count=2)
    assert collected(pytester, "-m", "multinode", "--nodes", "4") == [
        "test_scaling[1n1d]", "test_scaling[2n1d]", "test_scaling[4n1d]"]
    assert collected(pytester, "-m", "multinode", "--nodes", "2") == [
        "test_scaling[1n1d]", "test_scaling[2n1d]"]
    assert collected(pytester, "-m", "multinode", "--nodes", "2", "--devices-per-node", "2") == [
        "test_scaling[1n1d]", "test_scaling[1n2d]", "test_scaling[2n2d]"]
    assert collected(pytester, "-m", "multinode") == ["test_scaling[1n1d]", "test_scaling[1n2d]"]


def test_more_nodes_keep_the_single_node_tests_full_node_case(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    """With ``--nodes 2`` on a 2-core host each local node gets one rank (the nodes share the
    cores), and an unmarked test lost its full-node case with it: 4 cases became 2. A
    single-node case runs one node, which shares nothing: its full node is the host's."""
    fake_hardware(cpu_count=2)
    single = ["test_single[1n1d-fp32]", "test_single[1n1d-amp]", "test_single[1n2d-fp32]",
              "test_single[1n2d-amp]"]
    for nodes in ("1", "2", "4"):
        names = collected(pytester, "--nodes", nodes)
        assert [n for n in names if n.startswith("test_single")] == single, nodes
    # The scaling test's ladder still gives each of the nodes sharing the host one rank.
    assert [n for n in collected(pytester, "--nodes", "2") if n.startswith("test_scaling")] == [
        "test_scaling[1n1d]", "test_scaling[2n1d]"]
    # --devices-per-node is the user's word for both.
    assert collected(pytester, "--nodes", "2", "--devices-per-node", "1") == [
        "test_single[1n1d-fp32]", "test_single[1n1d-amp]", "test_scaling[1n1d]",
        "test_scaling[2n1d]"]


def test_local_nodes_share_this_hosts_cores_and_gpus(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_count=8)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-s", "-m", "multinode", "--nodes", "2", "--devices-per-node", "2")
    assert [line.split("SCALE ", 1)[1] for line in result.outlines if "SCALE " in line] == [
        "1n1d threads=8", "1n2d threads=4", "2n2d threads=2"]
    fake_hardware(gpus=(A100,) * 8, cpu_count=64)
    result = pytester.runpytest("-m", "multinode", "--nodes", "2", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*2n8d needs 16 GPUs and local mode runs every node on "
                                 "this host, which has 8*"])


def test_gpu_host_can_be_told_to_use_cpu(pytester: pytest.Pytester,
                                         fake_hardware: Callable[..., object]) -> None:
    fake_hardware(gpus=(A100,) * 8, cpu_count=4)
    assert collected(pytester, "-k", "single", "--dlperf-device", "cpu") == [
        "test_single[1n1d-fp32]", "test_single[1n1d-amp]", "test_single[1n2d-fp32]",
        "test_single[1n2d-amp]"]


@pytest.mark.parametrize("gpus, args, message", [
    ((A100,) * 2, ["--devices-per-node", "8"],
     "*--devices-per-node=8, but this host has 2 NVIDIA GPUs; pass --devices-per-node 2 or less*"),
    ((), ["--devices-per-node", "3"], "*--devices-per-node=3, but this host has 2 usable CPU "
     "cores*or --dlperf-oversubscribe to run more ranks than cores anyway*"),
    ((), ["--dlperf-device", "cuda"], "*--dlperf-device=cuda, but no NVIDIA GPU was found*"),
])
def test_device_counts_the_host_lacks_are_usage_errors(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object],
        gpus: tuple[str, ...], args: list[str], message: str) -> None:
    fake_hardware(gpus=gpus, cpu_count=2)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_unknown_framework_fails_that_test_clearly(pytester: pytest.Pytester,
                                                   fake_hardware: Callable[..., object]) -> None:
    fake_hardware(cpu_count=2)
    pytester.makepyfile(test_x="def test_x(throughput_meter):\n"
                               "    throughput_meter.measure('caffe')\n")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no framework adapter named 'caffe' (known: *torch*)*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "oneflow"])
def test_a_model_the_framework_lacks_fails_before_launch_naming_its_models(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], framework: str) -> None:
    """TensorFlow used to train ResNet-50 whatever was asked, and record it as "bert"."""
    fake_hardware(cpu_count=2)
    python = oneflow_interpreter() if framework == "oneflow" else Path(sys.executable)
    if not python.exists() or Adapter.resolve(framework).installed_version(str(python)) is None:
        pytest.skip(f"{framework} is not installed for {python}")
    pytester.makepyfile(test_x=f"def test_x(throughput_meter):\n"
                               f"    throughput_meter.measure({framework!r}, 'bert')\n")
    # Short windows, so that a regression (training anyway) fails fast instead of hanging.
    result = pytester.runpytest("-p", "no:cacheprovider", "--dlperf-baselines", "bl",
                                "--dlperf-update-baselines", "--dlperf-warmup-steps", "1",
                                "--dlperf-steps", "1", "--dlperf-repeats", "1",
                                "--dlperf-python", f"oneflow={oneflow_interpreter()}")
    result.assert_outcomes(failed=1)
    has = {"torch": "bert_base, gpt, insightface, resnet50, wide_deep",
           "oneflow": "bert_base, insightface, resnet50, wide_deep",
           "tensorflow": "bert_base, resnet50, wide_deep"}[framework]
    result.stdout.fnmatch_lines([f"*{framework} has no model 'bert' (has: {has})*"])
    result.stdout.no_fnmatch_line("*ranks failed*")  # refused before any rank started
    assert not (pytester.path / "bl").exists()


def test_real_detection_on_this_host_reports_cpu_without_nvml() -> None:
    from pytest_dlperf.core.topology import detect_hardware

    hardware = detect_hardware()  # the real sources: pynvml raises without a driver here
    assert hardware.cpu_count >= 1 and hardware.cpu_model
    assert hardware.device_type in ("cpu", "cuda")


COMPILED = """
def test_c(cluster, amp, compiler):
    print(f"COMPILER {cluster.topology.id}-{amp.name}-{compiler}")

def test_plain(cluster):
    pass
"""


@pytest.mark.parametrize("gpus, args, expected", [
    ((), [], ["eager"]),  # CPU: the compiled axis is opt-in
    ((A100,), [], ["eager", "compiled"]),
    ((), ["--dlperf-compilers", "eager,compiled"], ["eager", "compiled"]),
    ((A100,), ["--dlperf-compilers", "compiled"], ["compiled"]),
])
def test_the_compiler_axis_appears_where_a_test_names_it(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], gpus: tuple[str, ...],
        args: list[str], expected: list[str]) -> None:
    fake_hardware(gpus=gpus, cpu_count=2)
    pytester.makepyfile(test_c=COMPILED)
    result = pytester.runpytest("--collect-only", "-q", "--devices-per-node", "1", *args)
    assert result.ret == 0, result.stdout.str()
    ids = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert [i for i in ids if i.startswith("test_c[")] == [
        f"test_c[1n1d-{amp}-{c}]" for amp in ("fp32", "amp") for c in expected]
    assert "test_plain[1n1d]" in ids  # no compiler axis where the test does not ask for it


def test_a_bad_compiler_list_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_c=COMPILED)
    result = pytester.runpytest("--dlperf-compilers", "eager,jit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value for --dlperf-compilers=eager,jit: expected a "
                                 "comma-separated list of eager, compiled*"])


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_framework_build_that_sees_no_gpu_fails_its_case_saying_why(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], framework: str) -> None:
    """NVML says GPU, the framework as installed sees none (tensorflow-cpu on a GPU host, a CPU
    build of torch): the case fails with the reason and what to install, not an IndexError."""
    if Adapter.resolve(framework).installed_version() is None:
        pytest.skip(f"{framework} is not installed")
    fake_hardware(gpus=("NVIDIA H100 80GB HBM3",), cpu_count=2, driver="580.159.04")
    pytester.makepyfile(test_x=f"""
        def test_x(throughput_meter):
            throughput_meter.measure({framework!r})
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--dlperf-baselines", "bl",
                                "--dlperf-warmup-steps", "1", "--dlperf-steps", "1",
                                "--dlperf-repeats", "1", "--dlperf-timeout", "120")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*DeviceUnavailable: the case runs on CUDA*sees 0 GPU*"
                                 "--dlperf-device cpu*"])
    result.stdout.no_fnmatch_line("*IndexError*")
    result.stdout.no_fnmatch_line("*Traceback*")
    assert not list((pytester.path / "bl").rglob("*.json"))


@pytest.mark.usefixtures("subprocess_env")
def test_perf_cases_refuse_to_run_under_xdist_while_plain_tests_run(
        pytester: pytest.Pytester) -> None:
    """Under ``-n 2`` every xdist worker would start its own training ranks on the same cores
    (and write the same --dlperf-json): each perf case fails at once saying so."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_x="""
        def test_plain():
            pass

        def test_perf_a(throughput_meter):
            throughput_meter.measure("torch")

        def test_perf_b(cluster):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--dlperf-json", "r.json", timeout=120)
    result.assert_outcomes(passed=1, errors=3)  # test_perf_b runs at 1n1d and 1n2d
    result.stdout.fnmatch_lines(["*pytest-dlperf: perf cases cannot run under pytest-xdist*"
                                 "-p no:xdist*"])
    result.stdout.no_fnmatch_line("*ranks failed*")  # nothing was launched
    assert not (pytester.path / "r.json").exists()


PRECISION_TEST = """
def test_p(amp):
    assert amp.name in ("fp32", "amp")
"""


@pytest.mark.parametrize("bf16, args, outcomes", [
    (False, [], {"passed": 1, "skipped": 1}),  # the CPU would emulate bf16: AMP skips
    (False, ["--dlperf-precisions", "fp32,amp"], {"passed": 2}),  # asked for: it runs
    (True, [], {"passed": 2}),  # the CPU computes bf16 itself
    (False, ["--dlperf-precisions", "fp32"], {"passed": 1}),  # not collected at all
])
def test_cpu_amp_runs_where_the_cpu_has_bf16_or_where_asked_for(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], bf16: bool,
        args: list[str], outcomes: dict[str, int]) -> None:
    fake_hardware(cpu_bf16=bf16)
    pytester.makepyfile(test_p=PRECISION_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", *args)
    result.assert_outcomes(**outcomes)
    if outcomes.get("skipped"):
        result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_p.py:*: AMP on this CPU would time "
                                     "bf16 emulation*--dlperf-precisions fp32,amp runs it anyway"])


@pytest.mark.parametrize("args, outcomes", [
    ([], {"passed": 2, "skipped": 1}), (["--dlperf-oversubscribe"], {"passed": 3})])
def test_local_cpu_cases_with_more_ranks_than_cores_skip_unless_asked_for(
        pytester: pytest.Pytester, fake_hardware: Callable[..., object], args: list[str],
        outcomes: dict[str, int]) -> None:
    fake_hardware(cpu_count=2)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-m", "multinode", "--nodes", "4", "-rs", "-k", "scaling",
                                *args)
    result.assert_outcomes(**outcomes)
    if outcomes.get("skipped"):  # 1n1d and 2n1d run; 4n1d would put 4 ranks on 2 cores
        result.stdout.fnmatch_lines(["SKIPPED*4n1d runs 4 ranks and local mode runs every node "
                                     "on this host, which has 2 usable cores*"
                                     "--dlperf-oversubscribe runs it anyway*"])
