"""pytest-dlperf: deep-learning training throughput as pytest assertions.

The public API for your own models is the workload (``Workload``, ``Parts``, ``BuildContext``,
``SGD``), re-exported here. This package's top level imports nothing heavy: the worker side
(``worker``, ``meter``, ``protocol``, ``spec``, ``workload``, ``frameworks``) runs inside
training ranks, possibly under another Python, and must not pull in pytest.
"""

from .core.parallel import Layout
from .core.workload import SGD, AdamW, BuildContext, Parts, Workload, WorkloadError

__all__ = ["SGD", "AdamW", "BuildContext", "Layout", "Parts", "Workload", "WorkloadError"]
__version__ = "0.1.0"
