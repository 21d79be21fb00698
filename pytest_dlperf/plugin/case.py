"""One perf case as the pytest side sees it: the test, its topology, precision and compiler, the
framework adapter it uses, and what follows from those alone (the rank's spec, the baseline
fingerprint and key, the policy it is judged under, the record's identity), before anything is
launched. ``prepare`` makes one from what a test asked for; the meter and A/B mode both start
there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..core.batchsearch import BATCH
from ..core.facts import Facts
from ..core.parallel import Layout, LayoutSpelling
from ..core.phases import diagnostic_steps
from ..core.protocol import Protocol, launch_size
from ..core.recipes import RecipeReference
from ..core.spec import RankSpec, spec_for
from ..core.topology import Topology, earlier_fingerprints, fingerprint, python_minor
from ..core.workload import (
    CaseWorkload,
    Precision,
    SizeValue,
    Workload,
    WorkloadError,
    unknown_kinds,
)
from ..launch import Cluster
from ..models import builtin
from ..store.baselines import Baseline
from ..verdict.decide import Policy
from .adapters import Adapter
from .options import parse_marker
from .outcome import fail
from .session import SessionState

# Fingerprint fields that do not bear on how much memory a batch takes: an earlier search's
# answer is a good start whatever they are.
NOT_MEMORY = ("framework_version", "python", "accelerator_stack", "protocol", "batch_size",
              "link", "allocator")


@dataclass(frozen=True)
class Case:
    node: pytest.Item
    cluster: Cluster
    amp: Precision
    state: SessionState
    adapter: Adapter

    @property
    def id(self) -> str:
        """The baseline key: the test's node id, relative to the rootdir."""
        return self.node.nodeid

    @property
    def framework(self) -> str:
        return self.adapter.name

    @property
    def protocol(self) -> Protocol:
        return self.state.settings.protocol

    @property
    def compiler(self) -> str:
        """The test's ``compiler`` fixture; a test without one runs eager, or compiled where
        the framework has no eager mode (JAX: the adapter's ``eager_unavailable``)."""
        given = getattr(self.node, "funcargs", {}).get("compiler")
        if given is not None:
            return str(given)
        if self.adapter.unavailable("eager", self.cluster.device_type):
            return "compiled"
        return "eager"

    @property
    def layout(self) -> Layout:
        """How the ranks share the work: the test's ``layout`` fixture, else plain data
        parallelism over the case's ranks."""
        layout = getattr(self.node, "funcargs", {}).get("layout")
        return layout if isinstance(layout, Layout) else Layout(dp=self.cluster.world_size)

    def check_layout(self, workload: Workload) -> None:
        """A layout the workload or the adapter cannot run: a skip with the reason."""
        layout = self.layout
        if layout.is_data_parallel:
            return
        missing = [kind for kind in layout.kinds if kind not in workload.layouts]
        if missing:
            pytest.skip(f"workload {workload.name!r} does not support {', '.join(missing)} "
                        f"(layout {layout.id}; its layouts: {', '.join(workload.layouts)}): "
                        "a recipe that gives Parts.plans['tp'] / Parts.plans['pp'] says so "
                        "with Workload(layouts=...)")
        compiled = self.compiler != "eager"
        reason = self.adapter.layout_unavailable(layout.kinds, self.cluster.device_type,
                                                 compiled)
        if reason:
            pytest.skip(f"{self.framework} cannot run layout {layout.id} on "
                        f"{self.cluster.device_type}{' compiled' if compiled else ''}: "
                        f"{reason}")

    def fail(self, message: str) -> Any:
        fail(f"pytest-dlperf: {self.node.nodeid}: {message}")

    # -- can it run here? -----------------------------------------------------------------

    def framework_version(self) -> str:
        """The framework's installed version where the ranks run; skips where it is missing
        from pytest's interpreter, fails where it is missing from a given one."""
        python = self.cluster.pythons.get(self.framework)
        try:
            version = self.adapter.installed_version(python)
        except (LookupError, RuntimeError) as exc:
            where = f" (--dlperf-python {self.framework}={python})" if python else ""
            self.fail(f"{exc}{where}")
        if version is None and python:
            self.fail(f"{self.framework} is not installed in its worker interpreter {python} "
                      f"(--dlperf-python); {self.adapter.install_hint}")
        if version is None:
            pytest.skip(f"{self.framework} is not installed in pytest's interpreter and no "
                        f"--dlperf-python {self.framework}=PATH is given; "
                        f"{self.adapter.install_hint}")
        return version

    def check_modes(self) -> None:
        """AMP, the eager or the compiled step where the adapter says it cannot run them: a
        skip with its reason. A compiled case needs a warm-up step to compile in."""
        device = self.cluster.device_type
        reason = self.adapter.unavailable("amp", device) if self.amp.enabled else None
        if reason:
            pytest.skip(f"{self.framework} has no AMP on {device}: {reason}")
        if self.compiler == "eager":
            reason = self.adapter.unavailable("eager", device)
            if reason:
                pytest.skip(f"{self.framework} has no eager mode to measure: {reason} (its "
                            "cases run with --dlperf-compilers compiled, and by default in a "
                            f"test module whose FRAMEWORK = {self.framework!r})")
            return
        if self.protocol.warmup_steps < 1:
            self.fail("a compiled case needs at least one warm-up step (compilation happens "
                      "in the first step, which is never timed); raise --dlperf-warmup-steps")
        reason = self.adapter.unavailable("compile", device)
        if reason:
            pytest.skip(f"{self.framework} cannot compile on {device} here: {reason}")

    # -- what follows from the case alone ------------------------------------------------

    def spec(self, workload: Workload, sized: CaseWorkload,
             recipe: RecipeReference | None) -> RankSpec:
        """The one record every rank gets (the cluster adds where it runs)."""
        return spec_for(self.framework, workload, protocol=self.protocol,
                        device_type=self.cluster.device_type, precision=self.amp.name,
                        compiler=self.compiler, world_size=self.cluster.world_size,
                        batch_size=sized.batch_size, sizes=dict(sized.sizes), recipe=recipe,
                        layout=self.layout).with_(memory_limit=self.state.settings.memory_limit,
                                adapter_path=self.adapter.import_root,
                                phase_steps=self.phase_steps,
                                allocator=self.state.settings.allocator)

    @property
    def phase_steps(self) -> int:
        """Diagnostic steps per launch (``core.phases``); 0 with --dlperf-phases off."""
        if self.state.settings.phases == "off":
            return 0
        return diagnostic_steps(self.protocol.steps)

    def fingerprint(self, topology: Topology, version: str, env: dict[str, Any],
                    sized: CaseWorkload, searched: str | None,
                    layout: Layout | None = None) -> dict[str, Any]:
        """What a baseline must match to judge this case (``searched``: the size found by
        --dlperf-batch-size max (``batch_size``) or --dlperf-size NAME=max, and the
        fingerprint says "max" for it; ``layout``: another than the case's, the 1n1d
        reference's plain one). A layout beyond data parallelism enters it, so that a baseline
        of one layout never judges another."""
        layout = self.layout if layout is None else layout
        size = searched
        sizes = ({**sized.sizes, size: "max"} if size not in (None, BATCH)
                 else sized.sizes)
        return layout.fingerprint() | fingerprint(topology, framework=self.framework,
                           framework_version=str(env.get("framework_version", version)),
                           precision=self.amp.name, model=sized.model,
                           batch_size="max" if size == BATCH else sized.batch_size,
                           sizes=sizes, protocol_slug=self.protocol.slug,
                           python=python_minor(env.get("python")),
                           accelerator_stack=self._accelerator_stack(topology, env),
                           compiler=self.compiler, machine=self.state.settings.machine,
                           link=self.cluster.launcher.link_fingerprint(topology),
                           allocator=self.state.settings.allocator.label)

    def memory_match(self, version: str, sized: CaseWorkload, size: str = BATCH
                     ) -> dict[str, Any]:
        """The fingerprint fields that bear on how much memory a value of ``size`` (the batch,
        or a size searched for) takes: the others, the searched one as "max"."""
        fp = self.fingerprint(self.cluster.topology, version, {}, sized, searched=size)
        return {k: v for k, v in fp.items() if k not in NOT_MEMORY}

    def _accelerator_stack(self, topology: Topology, env: dict[str, Any]) -> str | None:
        if topology.device_type != "cuda":
            return None
        return (f"cuda{env.get('cuda')}-cudnn{env.get('cudnn')}-nccl{env.get('nccl')}"
                f"-driver{self.state.hardware.gpu_driver}")

    def aliases(self, case: str, fp: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Where older versions filed this case's baseline: under the test file's basename
        (before cases were keyed by rootdir-relative path), with pytest's Python in the
        fingerprint (before it was the ranks'), and without an allocator where the ranks ran
        on glibc as it comes (before --dlperf-allocator, they all did)."""
        name = case.partition("::")[2]
        cases = [case, f"{self.node.path.name}::{name}"]
        fps = [fp, *earlier_fingerprints(fp)]
        return [(c, f) for c in cases for f in fps][1:]

    def policy(self, baseline: Baseline | None) -> Policy:
        """The rules this case is judged by: the session's settings, the test's marker and
        the baseline's own tolerance."""
        settings, launcher = self.state.settings, self.cluster.launcher
        marker = self.node.get_closest_marker("dlperf")
        keywords = parse_marker(marker, self.node.nodeid) if marker else {}
        tolerance = keywords.get("tolerance")
        if tolerance is None:
            tolerance = (baseline.tolerance if baseline is not None
                         and baseline.tolerance is not None else settings.tolerance)
        launches = settings.launches if launcher.can_add_repeats else 1
        per_launch = launch_size(self.protocol.repeats, launches)
        return Policy(
            tolerance=float(tolerance), repeats=per_launch * launches,
            max_repeats=max(settings.max_repeats, per_launch * launches),
            can_add_repeats=launcher.can_add_repeats,
            update=settings.update_baselines, strict=settings.strict,
            unstable_cv=settings.unstable_cv, launches=launches,
            keep_launches=settings.baseline_launches,
            memory_tolerance=float(keywords.get("memory_tolerance", settings.memory_tolerance)),
            min_mfu=keywords.get("min_mfu"),
            straggler_threshold=settings.straggler_threshold)

    def display(self, path: Path) -> str:
        """A path as the messages show it: relative to the rootdir where it is under it."""
        try:
            return str(path.relative_to(self.state.rootpath))
        except ValueError:
            return str(path)

    def params_json(self) -> dict[str, Any]:
        """The test's parameters as JSON: a topology by its id, other objects by ``repr``."""
        callspec = getattr(self.node, "callspec", None)
        if callspec is None:
            return {}
        out: dict[str, Any] = {}
        for name, value in callspec.params.items():
            if isinstance(value, Topology):
                value = value.id
            elif isinstance(value, LayoutSpelling):
                value = value.text
            elif not isinstance(value, (str, int, float, bool, type(None))):
                value = repr(value)
            out[name] = value
        return out

    @property
    def param(self) -> str:
        callspec = getattr(self.node, "callspec", None)
        return callspec.id if callspec else ""

    def identity(self, version: str, env: dict[str, Any], sized: CaseWorkload,
                 fp: dict[str, Any]) -> dict[str, Any]:
        """The fields of a case record that say which case ran where and how, whatever its
        figures and verdict (the meter's record and the A/B record alike)."""
        launcher = self.cluster.launcher
        return dict(
            case=self.id, name=self.node.name, nodeid=self.node.nodeid,
            params=Facts(self.params_json()), param=self.param, framework=self.framework,
            framework_version=str(env.get("framework_version", version)),
            topology=self.cluster.topology, precision=self.amp, workload=sized,
            protocol=self.protocol, fingerprint=Facts(fp), environment=Facts(env),
            launcher=launcher.name, isolation=launcher.isolation,
            network=Facts(launcher.network(self.cluster.topology) or {}),
            compiler=self.compiler, machine=self.state.settings.machine,
            layout=self.layout)


@dataclass(frozen=True)
class Prepared:
    """A case as a test asked for it, checked before anything runs: the case (its adapter
    resolved once), the workload, its sizes on this device, the recipe the ranks will import,
    and the size to search for, if any (--dlperf-batch-size max: ``batch_size``;
    --dlperf-size NAME=max: ``NAME``)."""

    case: Case
    workload: Workload
    sized: CaseWorkload
    recipe: RecipeReference | None
    search: str | None


def prepare(node: pytest.Item, cluster: Cluster, amp: Precision, state: SessionState,
            framework: str, workload: Workload | str, batch_size: int | None,
            sizes: Mapping[str, SizeValue] | None) -> Prepared:
    """What ``measure(framework, workload, batch_size=..., sizes=...)`` asked for, resolved; a
    bad request fails the test before anything runs."""
    try:
        adapter = Adapter.resolve(framework)
        chosen = (builtin(workload, framework, adapter.recipe_key)
                  if isinstance(workload, str) else workload)
        unknown_kinds(chosen)
        recipe = adapter.recipe_for(chosen)
        batch = state.settings.batch_size or batch_size
        given = {name: value for name, value in (state.settings.size or {}).items()
                 if name in chosen.sizes}  # a size only the session's other workloads have
        state.sizes_used.update(given)
        search = BATCH if batch == "max" else next(
            (name for name, value in given.items() if value == "max"), None)
        over = {**(sizes or {}), **{k: v for k, v in given.items() if v != "max"}}
        sized = CaseWorkload.of(chosen, cluster.device_type, amp.name,
                                None if isinstance(batch, str) else batch, over)
    except (LookupError, WorkloadError) as exc:
        fail(f"pytest-dlperf: {node.nodeid}: {exc}")
    case = Case(node, cluster, amp, state, adapter)
    case.check_layout(chosen)
    return Prepared(case, chosen, sized, recipe, search)
