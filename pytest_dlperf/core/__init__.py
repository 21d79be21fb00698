"""The standard-library core, below everything else. What a case is: a workload and where its
recipes are (``workload``, ``recipes``), the JSON spec a rank gets (``spec``), topologies and
fingerprints (``topology``), a layout (``parallel``), the layout kinds and the strategies that
run them (``kinds``, ``strategies``), a local node's link (``link``). What a case measures: the
protocol and its figures (``protocol``), the step's phases (``phases``), the search for the
largest batch or size that fits (``batchsearch``), a size swept as a case axis and the line
through its rungs (``sweep``), what else ran on the host (``interference``), the heap allocator
(``allocator``). How processes are kept: lifelines and per-rank memory limits (``lifeline``,
``cgroup``), free ports (``ports``), git worktrees for A/B and bisection (``worktrees``), what
an interpreter imports from where and its environment's lock (``installs``), an A/B side's code
taken from its own tree (``sources``), an environment over another's (``overlay``). And the
small things every layer uses: name-to-value records (``facts``), sizes and rates (``units``),
JSON files (``jsonio``).

Imports the standard library only (and nothing of this package above it): the ranks import it
under any Python 3.10+, with or without pytest.
"""
