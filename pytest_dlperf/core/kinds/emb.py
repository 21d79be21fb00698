"""The ``emb`` layout kind: embedding tables sharded over the ranks (Wide & Deep's, a
recommender's). Each rank trains on a batch of its own (the dense part data parallel), the tables
cut by the plan its term names (``emb2-tw``). Registered here the way a kind of one's own is
(``register_kind``), after the built-in ones, so that the ids of the cases before it are
unchanged; its strategies are the frameworks' (``frameworks/torch/embedding.py``,
``frameworks/oneflow/embedding.py``).

Standard library only: ranks import it, under any Python 3.10+.
"""

from __future__ import annotations

from .registry import Kind, LayoutError, register_kind

EMBEDDING_PLANS = {
    "dp": "every table whole on every rank, its gradients averaged",
    "tw": "table-wise: each table whole on one rank",
    "cw": "column-wise: each table's columns split over the ranks",
    "twcw": "table-column-wise: column shards of a table on the ranks of one node",
    "rw": "row-wise: each table's rows split over the ranks",
    "sparse": ("every table whole on every rank, its sparse gradient all-reduced and applied by "
               "lazy Adam to the rows looked up"),
}


def _embedding_option(option: str) -> str | None:
    if option in EMBEDDING_PLANS:
        return None
    return "a plan: " + "; ".join(f"{name} ({what})" for name, what in EMBEDDING_PLANS.items())


def embedding_plan(layout_options: list[str]) -> str:
    """The plan an ``emb`` term names (``emb2-tw``: ``tw``); a ``LayoutError`` where it names
    none or more than one."""
    if len(layout_options) != 1:
        raise LayoutError(f"an emb term names one plan (emb2-tw); it has "
                          f"{', '.join(layout_options) or 'none'}: "
                          f"{_embedding_option('')}")
    return layout_options[0]


# The module is named (a user's kind has it recorded by ``register_kind``, with its folder): the
# package is on every rank's path, so no folder is carried to the ranks.
register_kind(Kind("emb", 1.5, True, _embedding_option, module=__name__, needs_option=True,
                   help="embedding tables sharded over the ranks, the dense part data parallel"))
