"""The session's settings, resolved from the options table (``options.OPTIONS``) with the
precedence command line > environment > ini > default, and validated where they are parsed: a
bad value raises ``pytest.UsageError`` saying where it came from (flag, variable or ini key),
what was wrong and what would be accepted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..core import protocol as protocol_mod
from ..core.allocator import Allocator
from .options import OPTIONS, Option


@dataclass(frozen=True)
class Settings:
    protocol: protocol_mod.Protocol
    batch_size: int | str | None  # None: each workload's own; "max": searched for
    size: dict[str, int | str] | None  # size -> a count or "max"; None: each workload's
    memory_limit: int | None  # bytes per rank
    search_budget: float  # seconds a max search's probes may take once a value fitted
    tolerance: float
    memory_tolerance: float
    straggler_threshold: float
    peak_flops: float | None
    phases: str  # "on": diagnostic steps cut into phases after the windows; "off": none
    speedup: str  # "on": multi-device cases' speedup against the 1n1d median; "off": none
    allocator: Allocator  # the ranks' heap allocator
    launches: int
    max_repeats: int
    unstable_cv: float
    busy_threshold: float  # the machine's share others may take before a launch is retried
    precisions: tuple[str, ...] | None  # None: both, AMP skipped on a CPU without bf16
    compilers: tuple[str, ...] | None  # None: the device type's default
    layouts: tuple[str, ...] | None  # None: each test's layouts marker, else dp
    sweep: dict[str, tuple[int, ...]] | None  # size -> rungs; None: each test's marker
    strict: bool
    update_baselines: str | None
    baseline_launches: int
    machine: str
    baselines: Path
    json: Path | None
    history: str | None  # an absolute SQLite path or a database URL
    change_pvalue: float  # a step in the history counts at or below it
    change_min: float  # the smallest throughput / efficiency step that fails a run
    nodes: int
    devices_per_node: int | None
    link: Any  # launch.fabric.Link, or None: unshaped
    oversubscribe: bool  # local CPU cases with more ranks than cores run anyway
    device: str
    launcher: str
    python: dict[str, str] | None  # framework -> worker interpreter (absolute path)
    ab: str | None  # A/B mode: the base side's git revision
    # A/B mode: the base side's rank interpreters, "*" in place of pytest's, or a framework's
    ab_python: dict[str, str] | None
    ab_build: str | None  # A/B mode: the command that builds the base side in its worktree
    # A/B mode: "turns" (one side after the other), "duet" (both at once) or "auto" (duet where
    # the case fits in half the machine)
    ab_mode: str
    timeout: float


def _raw(config: pytest.Config, opt: Option) -> tuple[Any, str, Path | None]:
    """The raw value, where it came from, and the folder a relative path is relative to."""
    value = config.getoption(opt.dest)
    if isinstance(value, list):  # a repeatable flag, given once or more
        value = ",".join(value)
    if value is not None:
        return value, f"{'/'.join((opt.cli, *opt.aliases))}={value}", Path(config.invocation_params.dir)
    if opt.env in os.environ:
        return os.environ[opt.env], f"environment variable {opt.env}={os.environ[opt.env]!r}", Path.cwd()
    ini = config.getini(opt.dest)
    if ini not in ("", None):
        where = config.inipath or "the ini file"
        return ini, f"ini key {opt.dest} = {ini!r} in {where}", config.rootpath
    return opt.default, "the default", config.rootpath


def source_of(config: pytest.Config, name: str) -> str:
    """Where option ``name``'s value came from, as messages name it."""
    return _raw(config, next(o for o in OPTIONS if o.name == name))[1]


def _max_repeats(config: pytest.Config, value: int | None, proto: protocol_mod.Protocol) -> int:
    if value is None:
        return 3 * proto.repeats
    if value < proto.repeats:
        _, source, _ = _raw(config, next(o for o in OPTIONS if o.name == "max_repeats"))
        raise pytest.UsageError(
            f"pytest-dlperf: bad value for {source}: it is below the protocol's {proto.repeats} "
            f"repeats per case; give at least {proto.repeats} (equal turns extra repeats off)")
    return value


def _sizes_and_batch(config: pytest.Config, values: dict[str, Any]) -> None:
    """--dlperf-size batch_size=... is --dlperf-batch-size; one of them, and one size max."""
    sizes = values["size"]
    if not sizes:
        return
    source = source_of(config, "size")
    if "batch_size" in sizes:
        if values["batch_size"] is not None:
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: batch_size is given "
                                    f"by {source_of(config, 'batch_size')} too; give it once")
        values["batch_size"] = sizes.pop("batch_size")
    maxed = [name for name, value in sizes.items() if value == "max"]
    if maxed and values["batch_size"] == "max":
        raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {maxed[0]}=max beside "
                                "--dlperf-batch-size max: one size is searched at a time")
    values["size"] = sizes or None


def resolve(config: pytest.Config) -> Settings:
    values: dict[str, Any] = {}
    bases: dict[str, Path | None] = {}
    for opt in OPTIONS:
        raw, source, base = _raw(config, opt)
        try:
            values[opt.name] = raw if source == "the default" else opt.parse(raw)
        except ValueError as exc:
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {exc}") from None
        bases[opt.name] = base
    try:
        proto = protocol_mod.resolve(values.pop("protocol"), values.pop("warmup_steps"),
                                     values.pop("steps"), values.pop("repeats"))
    except ValueError as exc:  # parsed values are valid; kept for safety against new profiles
        raise pytest.UsageError(f"pytest-dlperf: bad protocol: {exc}") from None
    values["max_repeats"] = _max_repeats(config, values["max_repeats"], proto)
    _sizes_and_batch(config, values)
    if values["machine"] is None:
        values["machine"] = default_machine()
    for name in ("baselines", "json"):
        if values[name] is not None:
            path = Path(values[name]).expanduser()
            values[name] = path if path.is_absolute() else (bases[name] or Path.cwd()) / path
    if values["history"] is not None and "://" not in values["history"]:
        path = Path(values["history"]).expanduser()
        values["history"] = str(path if path.is_absolute()
                                else (bases["history"] or Path.cwd()) / path)
    if values["python"] is not None:
        values["python"] = _interpreters(config, values["python"], bases["python"] or Path.cwd())
    if values["ab_python"] is not None:
        values["ab_python"] = _ab_python(config, values["ab_python"],
                                         bases["ab_python"] or Path.cwd())
    if values["ab_build"] is not None and values["ab"] is None:
        raise pytest.UsageError(f"pytest-dlperf: {source_of(config, 'ab_build')} builds the "
                                "base side in a worktree of its revision: give --dlperf-ab REV "
                                "with it")
    if values["ab_build"] is not None and not values["ab_build"].strip():
        raise pytest.UsageError(f"pytest-dlperf: {source_of(config, 'ab_build')} is empty: give "
                                "the command that builds the base side (e.g. 'pip install "
                                "--no-deps --no-build-isolation -e .')")
    if values["ab_mode"] != "turns" and values["ab"] is None and values["ab_python"] is None:
        raise pytest.UsageError(f"pytest-dlperf: {source_of(config, 'ab_mode')} is a way to run "
                                "an A/B comparison: give --dlperf-ab REV and/or "
                                "--dlperf-ab-python PATH with it")
    _check_outputs(config, values)
    return Settings(protocol=proto, **values)


def _ab_python(config: pytest.Config, raw: str, base: Path) -> dict[str, str]:
    """The base side's interpreters: ``PATH`` in place of pytest's (``"*"``: every framework
    whose ranks run under it on the head), ``FRAMEWORK=PATH`` for a framework's own; each an
    existing executable that runs Python."""
    _, source, _ = _raw(config, next(o for o in OPTIONS if o.name == "ab_python"))
    found: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",") if e.strip()):
        name, sep, value = entry.partition("=")
        key, value = (name, value) if sep and name.isidentifier() else ("*", entry)
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file() or not os.access(path, os.X_OK):
            problem = "does not exist" if not path.exists() else "is not an executable file"
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {path} {problem}; "
                                    "give the path of the base side's python executable")
        unfit = _interpreter_problem(path)
        if unfit:
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {path} {unfit}")
        found[key] = str(path)
    if not found:
        raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: empty; give the base "
                                "side's python executable (PATH, or FRAMEWORK=PATH)")
    return found


def _check_outputs(config: pytest.Config, values: dict[str, Any]) -> None:
    """Where results and baselines will be written must be writable before anything trains:
    a bad path found after the first case would waste its training and lose its figures."""
    checks = [("json", "file"), ("baselines", "folder")]
    for name, kind in checks:
        path = values[name]
        if path is None:
            continue
        problem = output_path_problem(path, kind, write=name == "json"
                                      or values["update_baselines"] is not None)
        if problem:
            _, source, _ = _raw(config, next(o for o in OPTIONS if o.name == name))
            raise pytest.UsageError(f"pytest-dlperf: bad value for {source}: {problem}")


def output_path_problem(path: Path, kind: str, write: bool = True) -> str | None:
    """Why ``path`` cannot be the ``kind`` ("file" or "folder") this run writes (or, with
    ``write=False``, reads), or None. Creates nothing: the first existing folder on the way
    must let us create the rest."""
    if path.exists():
        if kind == "file" and path.is_dir():
            return f"{path} is a folder; give a file path (like results.json)"
        if kind == "folder" and not path.is_dir():
            return f"{path} is a file, not a folder; give a folder for the baseline files"
        if write and not os.access(path if kind == "folder" else path.parent, os.W_OK):
            return f"{path} is not writable by this user; give a path you can write"
        return None
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return (f"{path} cannot be created: {ancestor} on its way is a file, not a folder; "
                "give a path under a folder")
    if write and not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{path} cannot be created: {ancestor} is not writable by this user; give a "
                "path you can write")
    return None


def default_machine() -> str:
    """The host name, and the start of the systemd machine id where there is one: VMs cloned
    from one image often share a host name ("vm"), and a host name alone is easily reused."""
    machine_id = _machine_id()[:8]
    name = _host_name()
    return f"{name}-{machine_id}" if re.fullmatch(r"[0-9a-f]{8}", machine_id) else name


def host_identity() -> str:
    """This computer, whatever ``--dlperf-machine`` calls it: its systemd machine id where there
    is one (the host's network and UTS namespaces, as the local nodes are, share it), else its
    host name. What a property of the hardware (a core's GEMM rate) is kept under."""
    return _machine_id() or _host_name()


def _host_name() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-.") or "host"


def _machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()
    except OSError:
        return ""


def _interpreters(config: pytest.Config, pythons: dict[str, str], base: Path) -> dict[str, str]:
    """Absolute paths, each an existing executable; the error names where the value came from."""
    _, source, _ = _raw(config, next(o for o in OPTIONS if o.name == "python"))
    resolved: dict[str, str] = {}
    for name, raw in pythons.items():
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file() or not os.access(path, os.X_OK):
            problem = "does not exist" if not path.exists() else "is not an executable file"
            raise pytest.UsageError(
                f"pytest-dlperf: bad value for {source}: {name}'s interpreter {path} {problem}; "
                "give the path of a python executable (for OneFlow: the path that "
                "scripts/setup-oneflow prints)")
        unfit = _interpreter_problem(path)
        if unfit:
            raise pytest.UsageError(
                f"pytest-dlperf: bad value for {source}: {name}'s interpreter {path} {unfit}")
        resolved[name] = str(path)
    return resolved


# The workers' own floor (``pytest_dlperf.rank.worker`` runs on this Python or newer).
WORKER_PYTHON = (3, 10)


def _interpreter_problem(path: Path) -> str | None:
    """Why ``path`` cannot run the workers (not a Python, too old), or None."""
    import subprocess

    try:
        done = subprocess.run([str(path), "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot be run ({exc}); give the path of a python executable"
    try:
        version = tuple(int(part) for part in done.stdout.split())
    except ValueError:
        version = ()
    if done.returncode != 0 or len(version) != 2:
        said = (done.stderr or done.stdout).strip()[-300:]
        return (f"is not a working Python (exit {done.returncode}: {said or 'no output'}); "
                "give the path of a python executable")
    if version < WORKER_PYTHON:
        need = ".".join(map(str, WORKER_PYTHON))
        return (f"is Python {version[0]}.{version[1]}; the workers need Python {need} or "
                "newer (for OneFlow 0.9: 3.10, as scripts/setup-oneflow makes)")
    return None
