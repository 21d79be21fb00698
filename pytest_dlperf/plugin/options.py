"""The plugin's options: one table (``OPTIONS``), each with a command-line flag, an environment
variable and an ini key that share one help string, the parsers that validate each value, and
the ``@pytest.mark.dlperf`` keywords. The options page of the documentation is rendered from the
same table (``options_markdown``; ``python -m pytest_dlperf options``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .. import frameworks
from ..core import allocator as allocator_mod
from ..core import batchsearch
from ..core import protocol as protocol_mod
from ..core.units import parse_flops, parse_size
from ..core.workload import COMPILERS
from ..launch import hook_modules
from .parsers import (
    _batch_size,
    _bool,
    _choice,
    _history,
    _int,
    _link,
    _machine_name,
    _optional,
    _path,
    _positive_float,
    _pvalue,
    _revision,
    _subset,
    parse_cv,
    parse_fraction,
    parse_layouts,
    parse_pythons,
    parse_sizes,
    parse_sweeps,
)


def _busy_share(raw: str) -> float:
    """A share of the machine in (0, 1]: 1 never finds it busy."""
    value = parse_cv(raw)
    if not 0 < value <= 1:
        raise ValueError(f"expected a share of the machine in (0, 1] (0.25 = 25%; 1 turns the "
                         f"check off), got {value}")
    return value


def _launcher_name(raw: str) -> str:
    """A launcher's name as spelled; whether a launcher has it is asked of the hooks that make
    them when the session starts (a conftest's names are known only then)."""
    value = str(raw).strip()
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", value):
        raise ValueError("expected a launcher's name (auto, local, slurm, ray, external, or one a "
                         "plugin adds: lowercase letters, digits, - and _)")
    return value


# The ``@pytest.mark.dlperf(...)`` keywords and their parsers.
MARKER_KEYWORDS: dict[str, Callable[[str], Any]] = {"tolerance": parse_fraction,
                                                    "memory_tolerance": parse_fraction,
                                                    "min_mfu": parse_fraction}


def parse_marker(marker: pytest.Mark, nodeid: str) -> dict[str, Any]:
    """A ``dlperf`` marker's keywords, parsed; a usage error naming the test otherwise."""
    known = ", ".join(MARKER_KEYWORDS)

    def refuse(problem: str) -> pytest.UsageError:
        return pytest.UsageError(f"pytest-dlperf: {nodeid}: @pytest.mark.dlperf(...) {problem}")

    if marker.args:
        raise refuse(f"takes keywords only (known: {known}), got {len(marker.args)} "
                     "positional argument(s)")
    parsed: dict[str, Any] = {}
    for key, value in marker.kwargs.items():
        if key not in MARKER_KEYWORDS:
            raise refuse(f"has an unknown keyword {key!r} (known: {known})")
        if value is None:
            continue
        try:
            parsed[key] = MARKER_KEYWORDS[key](value)
        except ValueError as exc:
            raise refuse(f"{key}={value!r}: {exc}") from None
    return parsed


@dataclass(frozen=True)
class Option:
    name: str  # "warmup_steps": --dlperf-warmup-steps, DLPERF_WARMUP_STEPS, dlperf_warmup_steps
    help: str
    parse: Callable[[Any], Any]
    default: Any = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    flag: bool = False  # takes no value on the command line
    const: str | None = None  # value when the flag is given bare (nargs="?")
    repeatable: bool = False  # the flag given several times: its values as one comma list

    @property
    def dest(self) -> str:
        return f"dlperf_{self.name}"

    @property
    def cli(self) -> str:
        return "--dlperf-" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return f"DLPERF_{self.name.upper()}"


OPTIONS: tuple[Option, ...] = (
    Option("protocol", "named measurement profile: full (DLPerf: 20 warm-up, 100 timed steps, "
           "7 repeats) or quick (5, 10, 5; for CI). Default: full.",
           _choice(*protocol_mod.PROFILES), "full", metavar="NAME"),
    Option("warmup_steps", "untimed warm-up steps before the first window (overrides the profile).",
           _optional(_int(0)), metavar="N"),
    Option("steps", "timed steps per window (overrides the profile).", _optional(_int(1)), metavar="N"),
    Option("repeats", "timed windows per case; the median is reported (overrides the profile).",
           _optional(_int(1)), metavar="N"),
    Option("batch_size", "per-device batch size of every case, overriding the workloads' own "
           "(per device type) and a test's measure(batch_size=...); it is part of the baseline "
           "fingerprint, so cases run at another batch compare with baselines of that batch. "
           "'max': the largest batch that trains without running out of memory, searched for "
           "each case (doubling then bisection, each probe a fresh launch; starting from the "
           "batch an earlier run found), then measured. Default: each workload's.",
           _optional(_batch_size), metavar="N|max"),
    Option("size", "a size of every case's workload that has it, overriding the workload's own "
           "and a test's measure(sizes=...), as --dlperf-batch-size does the batch: NAME=COUNT "
           "(vocab=1M; counts in k, M, G) or NAME=max: the largest value that trains without "
           "running out of memory, searched for each case as the batch is (doubling then "
           "bisection to 1/64 of the value, each probe a fresh launch; from what an earlier run "
           "found), then measured, the fingerprint saying max (docs/sweeps.md). One size may be "
           "max at a time; batch_size=... is --dlperf-batch-size. Default: each workload's.",
           _optional(parse_sizes), metavar="NAME=COUNT|max", repeatable=True),
    Option("search_budget", "seconds the probes of a --dlperf-batch-size max or "
           "--dlperf-size NAME=max search may take: once a value has fitted and the probes "
           "have taken this long, the search stops with the largest value that fitted and "
           "says so (the smallest that did not, if any). Default: "
           f"{batchsearch.DEFAULT_BUDGET_S:g}.", _positive_float, batchsearch.DEFAULT_BUDGET_S,
           metavar="SECONDS"),
    Option("memory_limit", "memory each rank may use, enforced by the OS on its processes: a "
           "memory cgroup of its own (v2, else v1), else an address-space limit. A rank that "
           "goes over fails as out of memory; with --dlperf-batch-size max it bounds the "
           "search on CPU. Binary units: 1536M, 2G. Default: none.",
           _optional(parse_size), metavar="SIZE"),
    Option("tolerance", "allowed throughput drop below the baseline median before a case fails, "
           "as a fraction (0.05) or percentage (5%). A baseline's own 'tolerance' and a "
           "@pytest.mark.dlperf(tolerance=...) marker take precedence. Default: 0.05.",
           parse_fraction, 0.05, metavar="FRACTION"),
    Option("memory_tolerance", "allowed growth of a case's peak memory above the baseline's "
           "before it fails as a memory regression, as a fraction or percentage. A "
           "@pytest.mark.dlperf(memory_tolerance=...) marker takes precedence. Default: 0.10.",
           parse_fraction, 0.10, metavar="FRACTION"),
    Option("straggler_threshold", "warn about a rank of a multi-device case whose own step "
           "time (forward and backward without the all-reduce) is more than this fraction "
           "slower than the median rank's. Default: 0.10.",
           parse_fraction, 0.10, metavar="FRACTION"),
    Option("phases", "on: after its timed windows, each launch runs a few diagnostic steps "
           "(a fifth of a window, 2 to 10) cut into phases (data, forward, backward, "
           "optimizer, exposed communication), which the results, the baseline and a "
           "regression's message report; off: none. Default: on.",
           _choice("on", "off"), "on", metavar="on|off"),
    Option("speedup", "on: each multi-device case's speedup and scaling efficiency against "
           "the 1n1d median of the same test (this session's 1n1d case, else its baseline, "
           "else a launch at 1n1d measured for it: docs/multinode.md, Scaling), the efficiency "
           "recorded and judged; off: none, and no 1n1d launch, for runs that gate the cases' "
           "throughput alone (a multi-node case's reference is a launch of its own). "
           "Default: on.", _choice("on", "off"), "on", metavar="on|off"),
    Option("allocator", "the heap allocator every rank runs under, set the same way in every "
           "launch and part of the fingerprint: glibc (glibc's malloc with its mmap and trim "
           "thresholds fixed at 32M and 64M, the most its own dynamic rule reaches: every "
           "launch starts in the state a long training process ends in), glibc:MMAP,TRIM "
           "(other fixed thresholds: glibc:4M,32M), glibc-dynamic (glibc as it comes: its "
           "thresholds follow what the process allocated and freed before, and a small CPU "
           "model's step ran 1.5x apart for it), jemalloc or tcmalloc (preloaded, found on "
           "this machine), or a shared library's path to preload. Why and what each gave: "
           "docs/resources.md. Default: glibc.",
           allocator_mod.parse, allocator_mod.Allocator(), metavar="NAME"),
    Option("peak_flops", "the device's dense peak FLOP/s for the precision the cases compute "
           "in (989.4T), for MFU on a GPU the built-in table lacks (one newer than this "
           "release); it replaces the table's figure. On a CPU, one core's peak: a rank's is it "
           "times the threads the rank computes with (a 1n1d rank on two cores has twice a "
           "1n2d rank's). Default: the table's, by NVML device name; on a CPU, a dense GEMM's "
           "rate on one core measured once per computer (kept in ~/.cache/pytest-dlperf) and said as "
           "measured, not as the hardware's peak.", _optional(parse_flops), metavar="FLOPS"),
    Option("launches", "separate launches per case (each a fresh start of the case's "
           "processes and its own warm-up); the windows (--dlperf-repeats) are split over them, "
           "and the verdict compares launch medians, so a run samples the between-run spread "
           "that windows of one launch hide. DLPerf's own repeats are launches "
           "(--dlperf-launches equal to --dlperf-repeats). 1 in external mode, where the job "
           f"was launched once. Default: {protocol_mod.DEFAULT_LAUNCHES}.",
           _int(1), protocol_mod.DEFAULT_LAUNCHES, metavar="N"),
    Option("max_repeats", "when a case's verdict is inconclusive (its median is beyond the "
           "tolerance but the difference is not significant) and more launches can settle it, "
           "launch again, judging after each launch, up to this many windows in total before "
           "deciding. At least the protocol's repeats (which turns it off). Default: 3 x "
           "repeats.",
           _optional(_int(1)), metavar="N"),
    Option("unstable_cv", "warn that a case is unstable when its repeats' coefficient of "
           "variation (stdev / mean) exceeds this, and refuse to record its baseline when its "
           "windows show it beyond their sampling error (--dlperf-update-baselines fails the "
           "case; 3 launches of 3 windows refuse from 1.45 x this; 0.10 or 10%; above 1 is allowed: n "
           "windows can vary by up to sqrt(n) x their mean). Default: 0.10.",
           parse_cv, 0.10, metavar="CV"),
    Option("busy_threshold", "baseline mode (and recording): the share of this host's CPU "
           "time (cores x wall time) that other processes and the hypervisor's steal may take "
           "during a launch, as a fraction or percentage. A launch beside more is run again "
           "(twice, after a short pause); still beside it, the case fails as machine busy, "
           "not judged: the baseline never shared that interference. A/B mode records it only "
           "(both sides share the machine); in turns, a host busier than this at the start "
           "runs both sides at the threads a rank the others leave room for, and says so. "
           "1 (100%) turns it off. Local launcher only (there "
           "every rank is this pytest's child). Default: 0.25.",
           _busy_share, 0.25, metavar="FRACTION"),
    Option("precisions", "the precision axis of tests that take the `amp` fixture, "
           "comma-separated: fp32, amp. Default: both; where a CPU has no bf16 instructions "
           "(avx512_bf16, amx_bf16) the AMP cases skip saying so, since they would time the "
           "emulation (BERT-base's bf16 step ran ~20x slower than its fp32 step on such a CPU); "
           "and on a CPU the scaling ladder's (multinode tests') AMP cases skip, opt-in "
           "(minutes a case). Naming amp here runs them anyway.",
           _optional(_subset("fp32", "amp")), metavar="LIST"),
    Option("compilers", "the compiler axis of tests that take the `compiler` fixture, "
           "comma-separated: eager, compiled ("
           + ", ".join(f"{how} for {name}" for name, how in frameworks.compilers().items())
           + "). "
           "Default: eager on CPU (a compiled ResNet-50 step was slower than eager here and a "
           "cold compile takes ~1 min), eager,compiled on CUDA.",
           _optional(_subset(*COMPILERS)), metavar="LIST"),
    Option("layouts", "the layout axis of tests that take the `layout` fixture: how a "
           "case's ranks share the work, comma-separated, each terms joined by x of dp (DDP), "
           "fsdp (FSDP2 / ZeRO-3), tp (tensor parallel), pp (pipeline parallel) with an "
           "optional degree, a term without one taking the ranks the others leave: dp, fsdp, "
           "tp, pp, fsdp2xtp2, pp2-gpipe-mb8 (docs/layouts.md). Overrides the test's "
           "@pytest.mark.layouts(...). A layout runs on the topologies whose ranks its "
           "degrees divide. Default: the marker's, else dp; on a CPU the scaling ladder "
           "(multinode tests) runs dp alone, its other layouts opt-in by naming them here.",
           _optional(parse_layouts), metavar="LIST"),
    Option("sweep", "run every test that takes the `sweep` fixture at each rung of a size of "
           "its workload, a case per rung (ids such as test_wide_deep[1n1d-fp32-vocab200k]), "
           "overriding the rungs of its @pytest.mark.sweep(NAME=...): NAME=LOW..HIGH:xFACTOR "
           "(vocab=200k..3.2M:x2), NAME=LOW..HIGH:+STEP or NAME=A,B,C; counts in k, M, G "
           "(10^3, 10^6, 10^9). A sweep stops at the first rung that runs out of memory (a "
           "result, not an error) and reports the largest that fit, each rung's latency and "
           "peak memory per device, and the memory a unit of the size costs (docs/sweeps.md). "
           "Give the flag once per size. Default: each test's marker.",
           _optional(parse_sweeps), metavar="NAME=LADDER", repeatable=True),
    Option("strict", "fail cases that have no baseline for this fingerprint, and cases whose "
           "verdict is still inconclusive after --dlperf-max-repeats.", _bool, False, flag=True),
    Option("update_baselines", "write the measured figures as the new baselines: 'all' (the bare "
           "flag: this run's launches replace the baseline's), 'add' (this run's launches are "
           "added to the baseline's, the newest --dlperf-baseline-launches kept: a baseline "
           "recorded over several runs knows its between-run spread) or 'missing' (only where "
           "none exists).",
           _optional(_choice("all", "add", "missing")), None, metavar="WHICH", const="all"),
    Option("baseline_launches", "the most launches a baseline keeps when "
           "--dlperf-update-baselines=add adds a run's to it (the oldest go first). "
           "Default: 20.", _int(2), 20, metavar="N"),
    Option("machine", "the name of this machine in the baseline store: baselines are filed "
           "under it (baselines/NAME/...) and judge only runs on the machine of that name, "
           "since hosts of one model and fingerprint have run 40-70% apart. Name a stable "
           "runner (asv asks the same); letters, digits, '.', '_' and '-'. Default: the host "
           "name and the first 8 characters of /etc/machine-id.",
           _optional(_machine_name), metavar="NAME"),
    Option("baselines", "folder of baseline JSON files. Default: baselines/ at the rootdir.",
           _path, "baselines", metavar="DIR"),
    Option("json", "write the results (pytest-benchmark's JSON format) to this file.",
           _optional(_path), metavar="PATH"),
    Option("history", "append every case's samples, fingerprint, commit, branch, date and host "
           "to this history store: a path is an SQLite file (.dlperf/history.db), a "
           "postgresql://user@host/db URL a shared PostgreSQL server. Its change points judge "
           "the nightly gate and `python -m pytest_dlperf html` plots it. Default: none.",
           _optional(_history), metavar="URL"),
    Option("change_pvalue", "with --dlperf-history: the p-value at or below which a step in a "
           "case's history counts (Student's t-test between the runs either side of it); a run "
           "after a step for the worse that no run since accepted by recording the baseline "
           "fails. Lower finds fewer false steps and needs more nights to find a real one "
           "(docs: History, 'Change points'). Default: 0.001.", _pvalue, 0.001, metavar="P"),
    Option("change_min", "with --dlperf-history: the smallest step of throughput or scaling "
           "efficiency that fails a run, as a fraction (0.01) or percentage (1%); smaller "
           "significant steps are reported only. Peak memory's is --dlperf-memory-tolerance. "
           "Default: 0.01.", parse_fraction, 0.01, metavar="FRACTION"),
    Option("nodes", "nodes in the cluster; -m multinode cases sweep 1, 2, 4, ... up to it. "
           "Default: 1.", _int(1), 1, aliases=("--nodes",), metavar="N"),
    Option("devices_per_node", "devices (GPUs; on CPU, worker processes) per node. Default: every "
           "GPU; on CPU 2 simulated devices, fewer for a multinode case's local nodes where "
           "they would otherwise run more ranks than the host has cores (cores / --nodes, at "
           "least 1; a single-node case keeps its 2).", _optional(_int(1)),
           aliases=("--devices-per-node",), metavar="N"),
    Option("link", "local mode, nodes as network hosts: each node's link to the others, RATE "
           "or RATE,DELAY (10gbit, 1gbit,0.2ms, 100mbit; 'unshaped'), shaped with the kernel's "
           "TBF (netem for a delay, where the kernel has it). It enters multi-node cases' "
           "fingerprints. Default: unshaped (the results say what the link measured).",
           _link, None, metavar="RATE[,DELAY]"),
    Option("oversubscribe", "local mode on CPU: run cases with more ranks than this host has "
           "cores (4n1d on 2 cores). By default they skip, saying so: ranks that share cores "
           "time the contention, and ran many times slower here.", _bool, False, flag=True),
    Option("device", "device type to train on: auto (cuda when NVIDIA GPUs are found), cuda or cpu.",
           _choice("auto", "cuda", "cpu"), "auto", metavar="TYPE"),
    Option("launcher", "how workers start: auto (external when pytest runs as a rank of a "
           "launched job, slurm inside a Slurm allocation, else local), local (torchrun agents "
           "for every node on this host, loopback rendezvous), slurm (one agent per allocated "
           "node via srun), ray (a Ray actor per rank on a running Ray cluster: "
           "--dlperf-ray-address), external (pytest was started by torchrun/srun on every "
           "rank), or "
           "a name a plugin or conftest adds (pytest_dlperf_make_launcher; "
           "docs/adding-a-launcher.md).",
           _launcher_name, "auto", metavar="NAME"),
    Option("python", "run a framework's worker processes under another Python interpreter, "
           "FRAMEWORK=PATH (comma-separated, or the flag once a framework): for frameworks that cannot live in "
           "pytest's interpreter, like OneFlow 0.9 (Python <= 3.10; scripts/setup-oneflow "
           "prints the path to give). The interpreter needs the framework and the standard "
           "library only. Default: pytest's own interpreter.",
           _optional(parse_pythons), metavar="FRAMEWORK=PATH", repeatable=True),
    Option("ab", "A/B mode: run every selected case alternately on a base side and on this "
           "checkout (the head), pair by pair, and judge head against base from the pairs "
           "(no baseline is read or written). REV is a git revision of the repository holding "
           "the test files: the base side's ranks import that repository's code from a worktree "
           "of it (the tests' folder, its packages installed editable, and in this plugin's "
           "own repository the plugin's rank side; the A/B header says what came from where). "
           "Default: off.",
           _optional(_revision), metavar="REV"),
    Option("ab_python", "A/B mode: the base side's rank interpreter (another framework build or "
           "version, another environment): PATH in place of pytest's interpreter (the "
           "frameworks whose ranks run under it on the head), FRAMEWORK=PATH in place of a "
           "framework's own --dlperf-python (comma-separated); alone, both sides run this "
           "checkout's code under two interpreters; with --dlperf-ab, the base side also runs "
           "REV's code. Default: the head's.",
           _optional(str), metavar="PATH|FRAMEWORK=PATH"),
    Option("ab_build", "A/B mode: a shell command that builds the base side in REV's "
           "worktree (a package with a compiled extension, which a worktree lacks), run there "
           "under an overlay of the base side's environment (a virtual environment that sees "
           "every package of it; what the command installs shadows them), whose python the "
           "base side's ranks then run under; its time is said in the A/B header. E.g. 'pip "
           "install --no-deps --no-build-isolation -e .'. Only with --dlperf-ab. Default: none.",
           _optional(str), metavar="COMMAND"),
    Option("ab_mode", "A/B mode: how the two sides share the machine. turns: one launch after "
           "the other, pair by pair (ABBA). duet: both at once on disjoint halves of this host "
           "(its cores, pinned; on GPUs its devices), each window started together on a shared "
           "barrier and judged on window-by-window ratios, the halves swapped between launches: "
           "both sides see the same interference (for busy or shared machines). Duet runs only "
           "cases that fit in half the machine on the local launcher. auto: duet where the case "
           "fits in half the machine, turns where it does not (a scaling case that needs every "
           "device; the nightly's choice). Only with --dlperf-ab or --dlperf-ab-python. "
           "Default: turns.",
           _choice("turns", "duet", "auto"), "turns", metavar="MODE"),
    Option("timeout", "seconds one case may take, start-up included, before its workers are "
           "killed and it fails. Default: 1800.", _positive_float, 1800.0, metavar="SECONDS"),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("dlperf", "deep-learning training throughput (pytest-dlperf)")
    for opt in OPTIONS:
        names = (opt.cli, *opt.aliases)
        # argparse %-formats help strings; ini help does not
        help = f"{opt.help} [env {opt.env}; ini {opt.dest}]".replace("%", "%%")
        if opt.flag:
            group.addoption(*names, dest=opt.dest, action="store_true", default=None, help=help)
        elif opt.const is not None:
            group.addoption(*names, dest=opt.dest, nargs="?", const=opt.const, default=None,
                            metavar=opt.metavar, help=help)
        elif opt.repeatable:
            group.addoption(*names, dest=opt.dest, action="append", default=None,
                            metavar=opt.metavar, help=help)
        else:
            group.addoption(*names, dest=opt.dest, default=None, metavar=opt.metavar, help=help)
        parser.addini(opt.dest, opt.help, type="string", default="")


def options_markdown() -> str:
    """The options reference as Markdown, one section per option, from ``OPTIONS``: the
    documentation's options page and ``python -m pytest_dlperf options`` print this."""
    lines = ["Every option has three spellings that share one help text: a command-line flag, "
             "an environment variable and an ini key (`[pytest]` / `[tool.pytest.ini_options]`)."
             " Precedence: command line > environment > ini > default; a bad value is a usage "
             "error naming where it came from.", ""]
    for opt in OPTIONS:
        flag = opt.cli if opt.flag else f"{opt.cli} {opt.metavar or 'VALUE'}"
        if opt.const is not None:
            flag = f"{opt.cli}[={opt.metavar or 'VALUE'}]"
        lines += [f"## `{opt.cli}`", "",
                  f"- command line: `{flag}`" + "".join(f", `{a}`" for a in opt.aliases),
                  f"- environment: `{opt.env}`",
                  f"- ini: `{opt.dest}`", "", opt.help, ""]
    # the built-in launchers' own options (Ray's), registered by their launchers
    lines += [module.options_markdown() for module in hook_modules()
              if hasattr(module, "options_markdown")]
    return "\n".join(lines)
