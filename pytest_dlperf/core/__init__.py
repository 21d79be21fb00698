"""The standard-library core, below everything else: what a workload is (``workload``), the
measurement protocol and its figures (``protocol``), the JSON spec a rank gets (``spec``),
topologies and fingerprints (``topology``), a case's layout (``parallel``), the layout kinds
and the strategies that run them (``kinds``, ``strategies``), process lifelines and per-rank
memory limits (``lifeline``, ``cgroup``), the batch-size search (``batchsearch``), units and
JSON files.

Imports the standard library only (and nothing of this package above it): the ranks import it
under any Python 3.10+, with or without pytest.
"""
