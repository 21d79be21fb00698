"""torch's ``emb-sparse`` plan: every table whole on every rank, its gradient sparse (the rows a
step looked up), all-reduced as a sparse tensor and applied at once by lazy Adam
(``torch.optim.SparseAdam``: only those rows' moments and weights move), as OneFlow's lazy Adam
did in DLPerf's Wide & Deep; the rest of the model averaged and updated by the workload's
optimizer as under the other plans.

The tables' update runs inside backward, in a hook on each table's weight once its gradient is
accumulated (as TorchRec's fused kernels update in backward), and leaves no gradient behind, so
the workload's optimizer, which takes dense gradients only, skips them. Lazy Adam is another
algorithm than Adam (rows not looked up keep their moments and weights): the plan's id says
so, and its check is against one process running lazy Adam on the same global batch.

Runs inside a rank; torch is passed in (the leading underscore keeps
``frameworks.known_frameworks`` from taking it for an adapter).
"""

from __future__ import annotations

from typing import Any

from ...core.strategies import TorchPart
from ...core.workload import WorkloadError


def lazy_tables(part: TorchPart, group: Any) -> None:
    """The model's ``nn.Embedding`` / ``nn.EmbeddingBag`` tables made sparse and updated by
    lazy Adam in backward, averaged over ``group``; the rest left to be averaged."""
    torch = part.torch
    opt = part.spec.optimizer
    if opt.kind != "adamw" or opt.weight_decay:
        raise WorkloadError(f"layout {part.layout.id}: emb-sparse updates the tables by lazy "
                            f"Adam (torch.optim.SparseAdam), which has no weight decay; the "
                            f"workload's optimizer is {opt.kind} with weight decay "
                            f"{opt.weight_decay}: give AdamW with weight_decay=0")
    if part.spec.precision.loss_scaling:
        raise WorkloadError(f"layout {part.layout.id}: emb-sparse with a loss scale (fp16 "
                            "AMP): the tables' update in backward would take scaled gradients; "
                            "run fp32 or bf16")
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    tables = {name: module for name, module in part.module.named_modules()
              if isinstance(module, kinds)}
    if not tables:
        raise WorkloadError(f"layout {part.layout.id}: emb-sparse makes the model's "
                            f"nn.Embedding tables sparse, and {type(part.module).__name__} "
                            "has none")
    dist = torch.distributed
    world = dist.get_world_size(group)
    for table in tables.values():
        table.sparse = True
        lazy = torch.optim.SparseAdam([table.weight], lr=opt.lr, betas=opt.betas, eps=opt.eps)

        def update(weight: Any, lazy: Any = lazy) -> None:
            grad = weight.grad.coalesce()
            if world > 1:  # gloo all-reduces sparse tensors: the rows every rank looked up
                dist.all_reduce(grad, group=group)
                grad = (grad / world).coalesce()
            weight.grad = grad
            lazy.step()
            weight.grad = None  # applied: the workload's optimizer skips it

        table.weight.register_post_accumulate_grad_hook(update)
    held = {id(table.weight) for table in tables.values()}
    part.averaged.append(([p for p in part.module.parameters()
                           if p.requires_grad and id(p) not in held], group))
    part.notes["emb"] = {"plan": "sparse", "tables": {
        name: [[-1, 0, 0, -1, -1]] for name in tables}}
