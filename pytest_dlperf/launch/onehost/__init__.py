"""A cluster on this one machine: nodes as network hosts (``fabric`` as root, ``userhosts`` as any
user; their links shaped and probed by ``linkprobe``), which local mode runs its agents in, and
what the real clusters on one machine share (``cluster``: their shape, their daemons by pid in
``daemons``, the ``keeper`` that holds one for ``dlperf slurm`` / ``dlperf ray``). The Slurm and
Ray clusters themselves are in ``launch/slurm/cluster.py`` and ``launch/ray/cluster.py``."""
