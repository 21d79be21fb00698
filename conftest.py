"""Repository-level pytest configuration.

The plugin itself is registered by its pytest11 entry point (``pip install -e .``), never from
here, so this repository runs exactly as users' repositories do. This file only keeps the
benchmark scripts out of collection: they print figures and are run by hand.
"""

collect_ignore = ["benchmarks"]
