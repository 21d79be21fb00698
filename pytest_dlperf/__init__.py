"""pytest-dlperf: deep-learning training throughput as pytest assertions.

This package's top level imports nothing heavy: the worker side (``worker``, ``meter``,
``protocol``, ``frameworks``) runs inside training ranks, possibly under another Python,
and must not pull in pytest.
"""

__version__ = "0.1.0"
