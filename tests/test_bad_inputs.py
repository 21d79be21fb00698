"""Bad inputs of every kind a user can give, each through pytest as a user runs it: options (on
the command line, in the environment, in the ini file), output paths, ``dlperf`` markers, the
``--dlperf-python`` interpreter, a workload that breaks, and baseline files that are broken. Each
gets a clear message saying what was wrong and where, no traceback from the plugin's own code, and
loses nothing: every file there before is there after with the same bytes, and the results file is
absent or whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch  # noqa: F401  (imported before pytester runs, as the suite's hygiene asks)
from _pytest.pytester import LineMatcher

# torch imported in the ranks only: a child pytest that collected it imported torch (~4 s here).
MLP_TEST = """
import os

from pytest_dlperf import BuildContext, Parts, Workload


def build(ctx: BuildContext) -> Parts:
    import torch

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.fc(x)  # the user's line a bad batch fails on

    how = os.environ.get("BREAK", "")
    if how == "raise":
        raise ValueError("width 48 does not divide into 5 heads")
    if how == "exit":
        os._exit(3)  # a rank that dies without a word (a segfault, the OOM killer)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    if how == "no-parameters":  # a model whose layers were all left out
        model = torch.nn.Sequential(torch.nn.Flatten())
    if how == "shape":  # a forward that fails on the batch: 31 features for a 32-wide layer
        return Parts(model=Head(), inputs=torch.randn(ctx.batch_size, 31),
                     targets=torch.randint(0, 10, (ctx.batch_size,)))
    if how == "tuple":  # what other benchmark harnesses ask a model function for
        return model, torch.randn(ctx.batch_size, 32), torch.randint(0, 10, (ctx.batch_size,))
    if how == "nan":
        with torch.no_grad():
            model[0].weight.fill_(float("nan"))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 32),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


MLP = Workload(name="mlp", recipes={"torch": build}, batch_size={"cpu": 16, "cuda": 16},
               unit=os.environ.get("UNIT", "samples"))


def test_mlp(throughput_meter):
    throughput_meter.measure(os.environ.get("FRAMEWORK", "torch"), MLP)
"""

# A tensor-parallel plan written for another model's paths, and one for a convolution.
TP_TEST = """
import os

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from pytest_dlperf import BuildContext, Parts, Workload


def build(ctx: BuildContext) -> Parts:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    plan = {"layers.0.q": ColwiseParallel(), "layers.0.o": RowwiseParallel()}
    if os.environ["BREAK"] == "tp-conv":
        model = torch.nn.Sequential(torch.nn.Unflatten(1, (1, 32)), torch.nn.Conv1d(1, 1, 1),
                                    torch.nn.Flatten(), torch.nn.Linear(32, 10))
        plan = {"1": ColwiseParallel(), "3": RowwiseParallel()}
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, 32),
                 targets=torch.randint(0, 10, (ctx.batch_size,)), plans={"tp": plan})


TP = Workload(name="tp", recipes={"torch": build}, batch_size={"cpu": 16, "cuda": 16},
              layouts=("dp", "tp"))


@pytest.mark.layouts("tp")
def test_tp(layout, throughput_meter):
    throughput_meter.measure("torch", TP)
"""

LAMBDA_TEST = """
from pytest_dlperf import Workload

INLINE = Workload(name="inline", recipes={"torch": lambda ctx: None}, unit="samples")


def test_inline(throughput_meter):
    throughput_meter.measure("torch", INLINE)
"""


def marked(marker: str) -> dict[str, str]:
    return {"test_marked.py": f"import pytest\n\n\n@pytest.mark.dlperf({marker})\n"
                              "def test_marked():\n    pass\n"}


# Every run: one 1n1d case, a short protocol, results to a file, baselines updated if it got
# that far (so a careless failure would show as a rewritten baseline). The MLP's 2-step windows
# are mostly noise: recording them needs a coefficient of variation allowed far above 10%.
COMMON = ("-p", "no:cacheprovider", "--devices-per-node", "1", "--dlperf-warmup-steps", "1",
          "--dlperf-steps", "2", "--dlperf-repeats", "2", "--dlperf-launches", "1",
          "--dlperf-machine", "box", "--dlperf-json", "results.json",
          "--dlperf-update-baselines", "add", "--dlperf-unstable-cv", "10")


def _edit_baseline(change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return edit


def _truncate(path: Path) -> None:
    path.write_text(path.read_text()[: len(path.read_text()) // 2])


def _garble(path: Path) -> None:
    path.write_text("median: 12.5 samples/s (pasted from a chat)\n")


def _folder_in_place(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "notes.txt").write_text("someone's notes\n")


def _symlink_loop(path: Path) -> None:
    # Unreadable whoever runs it (mode bits do not stop root): a link that points at itself.
    path.unlink()
    path.symlink_to(path.name)


@dataclass(frozen=True)
class Bad:
    id: str
    says: tuple[str, ...]  # fnmatch patterns the output must match, in order
    args: tuple[str, ...] = ()  # "{root}", "{noexec}", "{old_python}", ... are filled in
    env: dict[str, str] = field(default_factory=dict)
    ini: str = ""
    files: dict[str, str] = field(default_factory=dict)
    baseline: Callable[[Path], None] | None = None  # breaks the recorded baseline file
    usage: bool = True  # a usage error at start-up (else: the case fails)
    measured: bool = False  # the case trained before it failed (it is in the results file)
    never: tuple[str, ...] = ()  # fnmatch patterns no output line may match
    root_bypasses: bool = False  # permission checks that root is exempt from


BAD = [
    # -- options: command line, environment, ini ------------------------------------------------
    Bad("cli-repeats-zero", ("*bad value for --dlperf-repeats=0: expected an integer >= 1*",),
        args=("--dlperf-repeats", "0")),
    Bad("cli-device-tpu", ("*bad value for --dlperf-device=tpu: expected one of auto, cuda, cpu*",),
        args=("--dlperf-device", "tpu")),
    Bad("cli-update-append", ("*bad value for --dlperf-update-baselines=append*all, add, "
                              "missing*",),
        args=("--dlperf-update-baselines", "append")),
    Bad("cli-machine-path", ("*bad value for --dlperf-machine=../x: expected a name of letters*",),
        args=("--dlperf-machine", "../x")),
    Bad("cli-too-many-devices", ("*--devices-per-node=64, but this host has * usable CPU cores*",),
        args=("--devices-per-node", "64")),
    Bad("cli-slurm-outside-allocation", ("*--dlperf-launcher=slurm, but this is not inside a "
                                         "Slurm allocation*salloc or sbatch*",),
        args=("--dlperf-launcher", "slurm")),
    Bad("cli-allocator-unknown", ("*bad value for --dlperf-allocator=ptmalloc: expected glibc "
                                  "(fixed thresholds, the default), glibc:MMAP,TRIM, "
                                  "glibc-dynamic, jemalloc, tcmalloc or a library's path*",),
        args=("--dlperf-allocator", "ptmalloc")),
    Bad("cli-allocator-no-library", ("*bad value for --dlperf-allocator=*libnone.so: no shared "
                                     "library at *libnone.so to preload*",),
        args=("--dlperf-allocator", "{root}/libnone.so")),
    Bad("env-allocator-one-threshold", ("*environment variable DLPERF_ALLOCATOR='glibc:4M'*"
                                        "glibc's fixed thresholds are glibc:MMAP,TRIM*",),
        env={"DLPERF_ALLOCATOR": "glibc:4M"}),
    Bad("env-tolerance", ("*environment variable DLPERF_TOLERANCE='lots'*expected a fraction*",),
        env={"DLPERF_TOLERANCE": "lots"}),
    Bad("env-nodes-zero", ("*environment variable DLPERF_NODES='0'*integer >= 1*",),
        env={"DLPERF_NODES": "0"}),
    Bad("env-timeout-negative", ("*environment variable DLPERF_TIMEOUT='-5'*seconds > 0*",),
        env={"DLPERF_TIMEOUT": "-5"}),
    Bad("ini-nodes", ("*ini key dlperf_nodes = 'zero' in *tox.ini: expected an integer*",),
        ini="dlperf_nodes = zero"),
    Bad("ini-compilers", ("*ini key dlperf_compilers = 'jit' in *tox.ini*eager, compiled*",),
        ini="dlperf_compilers = jit"),
    # -- output paths: refused before anything trains -------------------------------------------
    Bad("json-under-proc-file", ("*bad value for --dlperf-json=/proc/version/x.json: "
                                 "*/proc/version on its way is a file*",),
        args=("--dlperf-json", "/proc/version/x.json")),
    Bad("json-under-a-file", ("*--dlperf-json=*/notes.txt/out/x.json: *notes.txt on its way is "
                              "a file, not a folder*",),
        args=("--dlperf-json", "{root}/notes.txt/out/x.json")),
    Bad("json-is-a-folder", ("*--dlperf-json=*baselines: *baselines is a folder; give a file*",),
        args=("--dlperf-json", "{root}/baselines")),
    Bad("json-not-writable", ("*--dlperf-json=*locked/x.json: *locked is not writable*",),
        args=("--dlperf-json", "{root}/locked/x.json"), root_bypasses=True),
    Bad("baselines-under-proc-file", ("*bad value for --dlperf-baselines=/proc/version/x: "
                                      "*/proc/version on its way is a file*",),
        args=("--dlperf-baselines", "/proc/version/x")),
    Bad("baselines-is-a-file", ("*environment variable DLPERF_BASELINES=*notes.txt*is a file, "
                                "not a folder*",),
        env={"DLPERF_BASELINES": "{root}/notes.txt"}),
    # -- dlperf markers ------------------------------------------------------------------------
    Bad("marker-bad-tolerance", ("*test_marked.py::test_marked: @pytest.mark.dlperf(...) "
                                 "tolerance='lots': expected a fraction*",),
        files=marked("tolerance='lots'")),
    Bad("marker-positional", ("*test_marked: @pytest.mark.dlperf(...) takes keywords only*",),
        files=marked("0.05")),
    Bad("marker-unknown-keyword", ("*has an unknown keyword 'tolerence' (known: tolerance, "
                                    "memory_tolerance, min_mfu)*",),
        files=marked("tolerence=0.05")),
    # -- the workers' interpreter (--dlperf-python) ----------------------------------------------
    Bad("python-missing", ("*environment variable DLPERF_PYTHON=*torch's interpreter "
                           "/no/such/python does not exist*",),
        env={"DLPERF_PYTHON": "torch=/no/such/python"}),
    Bad("python-not-executable", ("*--dlperf-python=torch=*notes.txt: torch's interpreter "
                                  "*notes.txt is not an executable file*",),
        args=("--dlperf-python", "torch={root}/notes.txt")),
    Bad("python-not-python", ("*torch's interpreter *fake-python is not a working Python "
                              "(exit 1: *not really python*",),
        args=("--dlperf-python", "torch={fake_python}")),
    Bad("python-too-old", ("*torch's interpreter * is Python 3.*; the workers need Python 3.10 "
                           "or newer*",),
        args=("--dlperf-python", "torch={old_python}")),
    Bad("python-without-framework", ("*torch is not installed in its worker interpreter "
                                     "*bare*python* (--dlperf-python)*",),
        args=("--dlperf-python", "torch={bare_python}"), usage=False),
    # -- the workload ---------------------------------------------------------------------------
    Bad("workload-raises", ("*test_mlp failed on 1n1d: 1 of 1 ranks failed (failed)*",
                            "*--- rank 0 ---*", '*File "*test_mlp.py", line *, in build*',
                            "*ValueError: width 48 does not divide into 5 heads*"),
        env={"BREAK": "raise"}, usage=False),
    Bad("workload-loss-nan", ("*test_mlp diverged on 1n1d: 1 of 1 ranks failed (diverged)*",
                              "*Diverged: rank 0: loss is nan after timed window 0*"),
        env={"BREAK": "nan"}, usage=False),
    Bad("rank-exits-without-result", ("*test_mlp failed on 1n1d: rank 0 ended (exit code 3) "
                                      "without a result*",),
        env={"BREAK": "exit"}, usage=False),
    Bad("workload-returns-tuple", ("*test_mlp failed on 1n1d: 1 of 1 ranks failed (failed)*",
                                   "*WorkloadError: the recipe test_mlp:build returned a tuple "
                                   "(of 3), not Parts: a recipe must return "
                                   "pytest_dlperf.Parts(model=..., inputs=..., targets=...)*"),
        env={"BREAK": "tuple"}, usage=False, never=("*AttributeError*",)),
    Bad("workload-lambda", ("*test_inline: workload 'inline', torch recipe: a lambda cannot be "
                            "a recipe*",),
        files={"test_inline.py": LAMBDA_TEST}, args=("-k", "inline"), usage=False),
    Bad("workload-unit-empty", ("*test_mlp: workload 'mlp': unit must name what one sample is, "
                                "a word such as 'samples'*got ''*",),
        env={"UNIT": ""}, usage=False),
    Bad("workload-unit-a-rate", ("*test_mlp: workload 'mlp': unit 'images/s' names a rate; give "
                                 "what one sample is ('images')*",),
        env={"UNIT": "images/s"}, usage=False),
    Bad("workload-no-parameters", ("*test_mlp failed on 1n1d: 1 of 1 ranks failed (failed)*",
                                   "*WorkloadError: the recipe test_mlp:build returned a model "
                                   "with no trainable parameters*"),
        env={"BREAK": "no-parameters"}, usage=False, never=("*empty parameter list*",)),
    Bad("workload-no-parameters-ddp", ("*test_mlp failed on 1n2d: 2 of 2 ranks failed*",
                                       "*--- ranks 0, 1 ---*",
                                       "*WorkloadError: the recipe test_mlp:build returned a "
                                       "model with no trainable parameters*"),
        env={"BREAK": "no-parameters"}, args=("--devices-per-node", "2"), usage=False,
        never=("*DistributedDataParallel is not needed*",)),
    # A forward that fails on the batch's shape, on two ranks: the user's frame and the layer's
    # line that raised, once for both ranks, without DDP's and Module.__call__'s frames.
    Bad("forward-fails-on-the-batch", ("*test_mlp failed on 1n2d: 2 of 2 ranks failed*",
                                       "*--- ranks 0, 1 ---*",
                                       '*File "*test_mlp.py", line *, in forward*',
                                       "*return self.fc(x)*",
                                       '*File "*linear.py", line *, in forward*',
                                       "*RuntimeError: mat1 and mat2 shapes cannot be multiplied*",
                                       "*frame(s) of pytest-dlperf and of library calls between "
                                       "your code and the error left out*"),
        env={"BREAK": "shape"}, args=("--devices-per-node", "2"), usage=False,
        never=("*distributed.py*", "*_call_impl*", "*--- rank 1 ---*")),
    # A tensor-parallel plan that names no module of the model (torch skips such an entry with
    # a warning: the case measured an unsharded model as tp2), and one for a layer kind its
    # style cannot shard (torch's own error names no module): refused before training.
    Bad("tp-plan-names-no-module", ("*test_tp[[]tp] failed on 1n2d: 2 of 2 ranks "
                                    "failed*",
                                    "*WorkloadError: Parts.plans[[]'tp'[]] names 'layers.0.q', which "
                                    "matches no module of the model (Sequential; its modules: "
                                    "0, 1, 2)*"),
        env={"BREAK": "tp-missing"}, files={"test_tp.py": TP_TEST},
        args=("--devices-per-node", "2", "-k", "tp"),
        usage=False, never=("*samples/s*",)),
    Bad("tp-plan-on-a-convolution", ("*test_tp[[]tp] failed on 1n2d: 2 of 2 ranks "
                                     "failed*",
                                     "*WorkloadError: Parts.plans[[]'tp'[]]: '1' -> ColwiseParallel, "
                                     "which shards nn.Linear and nn.Embedding only, and 1 is "
                                     "Conv1d*"),
        env={"BREAK": "tp-conv"}, files={"test_tp.py": TP_TEST},
        args=("--devices-per-node", "2", "-k", "tp"),
        usage=False, never=("*currently only support*",)),
    # A library the dynamic linker will not preload (it says so, and carries on without it):
    # the rank refuses to measure another heap than the case's.
    Bad("allocator-not-preloaded", ("*test_mlp*1n1d*",
                                    "*AllocatorError: --dlperf-allocator libbroken.so: this "
                                    "rank's malloc is *libc.so*, not *libbroken.so: the dynamic "
                                    "linker did not preload it here*"),
        files={"libbroken.so": "not a shared library\n"},
        args=("--dlperf-allocator", "{root}/libbroken.so"), usage=False),
    Bad("unknown-framework", ("*test_mlp: no framework adapter named 'tensorflw' (known: *",),
        env={"FRAMEWORK": "tensorflw"}, usage=False),
    # -- recording a baseline on a busy machine: refused, the stored one kept as it was --------
    Bad("record-unstable", ("*test_mlp: baseline not recorded: the windows of its * launch(es) "
                            "vary around their own launch's mean by *% (coefficient of "
                            "variation within launches, * degrees of freedom), above "
                            "--dlperf-unstable-cv 0% beyond their sampling error*"
                            "--dlperf-unstable-cv *%*",),
        args=("--dlperf-unstable-cv", "0"), usage=False, measured=True),
    # -- baseline files -------------------------------------------------------------------------
    Bad("baseline-truncated", ("*baseline file *.json: truncated (it ends mid-document)*",),
        baseline=_truncate, usage=False),
    Bad("baseline-not-json", ("*baseline file *.json: not valid JSON*fix it, delete it*",),
        baseline=_garble, usage=False),
    Bad("baseline-wrong-types", ("*baseline file *.json: 'metrics.samples_per_s.median' must be "
                                 "a positive number*",),
        baseline=_edit_baseline(lambda d: {**d, "metrics": {
            k: {**m, "median": "fast"} for k, m in d["metrics"].items()}}), usage=False),
    Bad("baseline-newer-schema", ("*baseline file *.json: schema_version 99 is newer than this "
                                  "pytest-dlperf understands*",),
        baseline=_edit_baseline(lambda d: {**d, "schema_version": 99}), usage=False),
    Bad("baseline-folder-in-place", ("*baseline file *.json: is a folder, not a file; move it "
                                     "away*",),
        baseline=_folder_in_place, usage=False),
    Bad("baseline-unreadable", ("*baseline file *.json: cannot be read (*Too many levels of "
                                "symbolic links*",),
        baseline=_symlink_loop, usage=False),
]


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file and link under ``root`` (caches and the runs' scratch aside): what must not be
    lost or changed."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        # Not the runs' own: pytest-benchmark's empty storage folder (.benchmarks), pytester's
        # (runpytest-N, stdout, stderr).
        if (rel.parts[0] in ("tmp", "results.json", ".benchmarks", "stdout", "stderr")
                or rel.parts[0].startswith("runpytest-") or "__pycache__" in rel.parts):
            continue
        if path.is_symlink():
            found[str(rel)] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(rel)] = path.read_bytes()
        elif path.is_dir():
            found[str(rel)] = "<folder>"
    return found


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline store holding the MLP case's baseline, recorded by a real run."""
    root = tmp_path_factory.mktemp("recorded")
    (root / "test_mlp.py").write_text(MLP_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLPERF_")}
    # As subprocess_env's runs (tests/conftest.py): a recording beside another job's load (a
    # second xdist worker in scripts/test) is not refused as busy.
    env.update(TMPDIR=str(root), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               DLPERF_BUSY_THRESHOLD="1")
    done = subprocess.run([sys.executable, "-m", "pytest", *COMMON], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "baselines"


@pytest.fixture(scope="module")
def interpreters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The interpreters the --dlperf-python rows name: one that is not Python, an old one (where
    this host has one), and a working one without torch (a fresh virtual environment)."""
    folder = tmp_path_factory.mktemp("pythons")
    fake = folder / "fake-python"
    fake.write_text("#!/bin/sh\necho 'not really python' >&2\nexit 1\n")
    fake.chmod(0o755)
    bare = folder / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    old = ""
    for minor in range(9, 5, -1):
        candidates = [*map(str, Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python")),
                      shutil.which(f"python3.{minor}")]
        old = next((c for c in candidates if c and _runs(c)), "")
        if old:
            break
    return {"fake_python": str(fake), "bare_python": str(bare / "bin" / "python"),
            "old_python": old}


def _runs(python: str) -> bool:
    try:
        done = subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60)
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.usefixtures("subprocess_env")
@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_a_bad_input_gets_a_clear_message_and_loses_nothing(
        bad: Bad, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        recorded: Path, interpreters: dict[str, str]) -> None:
    if bad.root_bypasses and os.geteuid() == 0:
        pytest.skip("runs as root here, whom file permissions do not stop")
    if "{old_python}" in " ".join(bad.args) and not interpreters["old_python"]:
        pytest.skip("no Python older than 3.10 on this host")
    root = pytester.path
    pytester.makepyfile(test_mlp=MLP_TEST)
    for name, text in bad.files.items():
        (root / name).write_text(text)
    (root / "notes.txt").write_text("a file, not a folder\n")
    (root / "locked").mkdir()
    (root / "locked").chmod(0o500)
    shutil.copytree(recorded, root / "baselines")
    if bad.baseline is not None:
        [path] = (root / "baselines").rglob("*.json")
        bad.baseline(path)
    if bad.ini:
        pytester.makeini(f"[pytest]\n{bad.ini}\n")
    fill = {"root": str(root), **interpreters}
    for key, value in bad.env.items():
        monkeypatch.setenv(key, value.format(**fill))
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    before = snapshot(root)
    args = [*COMMON, *(arg.format(**fill) for arg in bad.args)]
    if bad.usage:  # refused at start-up: in-process is enough, and quick
        result = pytester.runpytest(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        output = result.stderr.lines
        assert "Traceback" not in result.stderr.str()
    else:
        result = pytester.runpytest_subprocess(*args, timeout=300)
        assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
        result.assert_outcomes(failed=1)
        output = result.stdout.lines + result.stderr.lines
    assert_matches(output, bad.says)
    for pattern in bad.never:
        LineMatcher(output).no_fnmatch_line(pattern)
    plugin_frames = [line for line in output
                     if line.lstrip().startswith("File ") and "pytest_dlperf" in line]
    assert plugin_frames == [], "a traceback through the plugin's own code"
    assert snapshot(root) == before, "a file was changed, added or lost"
    results = root / "results.json"
    if results.exists():  # written whole, never half
        benchmarks = json.loads(results.read_text())["benchmarks"]
        assert [b["name"] for b in benchmarks] == (["test_mlp"] if bad.measured else [])
    assert not list(root.rglob("*.tmp"))


def assert_matches(lines: list[str], patterns: tuple[str, ...]) -> None:
    LineMatcher(lines).fnmatch_lines(list(patterns))
