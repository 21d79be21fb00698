"""pytest-dlperf: deep-learning training throughput as pytest assertions.

The public API for your own models is the workload (``Workload``, ``Parts``, ``BuildContext``,
``SGD``), re-exported here, and for a layout kind of your own its entry and strategies
(``Kind``, ``register_kind``, ``register_strategy``, ``TorchPart``: docs/adding-a-layout-kind.md). This package's top level imports nothing heavy: the worker side
(``worker``, ``meter``, ``protocol``, ``spec``, ``workload``, ``frameworks``) runs inside
training ranks, possibly under another Python, and must not pull in pytest.
"""

from .core.kinds import Kind, register_kind
from .core.parallel import Layout
from .core.strategies import TorchPart, register_strategy
from .core.workload import SGD, AdamW, BuildContext, Parts, Workload, WorkloadError

__all__ = ["SGD", "AdamW", "BuildContext", "Kind", "Layout", "Parts", "TorchPart", "Workload",
           "WorkloadError", "register_kind", "register_strategy"]
__version__ = "0.1.0"
