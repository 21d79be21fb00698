"""torch's loss scaling (fp16 AMP: CUDA's), for a whole replica per rank and for a sharded one.

Under DDP every rank holds the same all-reduced gradients, so torch's ``GradScaler`` finds the
same inf on each and they skip a step together. A sharded replica (FSDP, tensor or pipeline
parallel) holds a part of the gradients per rank, and ``GradScaler`` breaks there three ways,
each seen on an H200 or reproduced on this CPU with fp16 autocast:

- tensor parallelism leaves some gradients plain (a norm's) and makes others DTensors, and its
  one inf check over both fails ("got mixed torch.Tensor and DTensor");
- a rank whose shard holds no inf would step while the one whose shard does skips: replicated
  parameters part ways and the scales differ;
- a pipeline's stages before the last never scale a loss, so their scaler has no scale and
  ``step`` fails ("_scale is None").

``loss_scaler`` gives a sharded replica a ``GradScaler`` whose inf check reads each DTensor
gradient through its local shard and takes the largest flag over the world (torch's own
``ShardedGradScaler`` sums the flags: a fused optimizer then neither skips nor counts its steps
right, and FSDP's fp16 parameters went NaN here), with its scale made on every rank at start.

Runs inside a rank; torch is passed in, never imported at module level.
"""

from __future__ import annotations

from typing import Any

from .._loss_scale import POLICY


def loss_scaler(torch: Any, device: Any, enabled: bool, sharded: bool) -> Any:
    """The step's loss scaler, on the one policy (``_loss_scale.POLICY``): disabled where the
    precision scales no loss."""
    policy = {"init_scale": POLICY.initial, "growth_factor": POLICY.growth,
              "backoff_factor": POLICY.backoff, "growth_interval": POLICY.interval}
    if not (enabled and sharded):
        return torch.amp.GradScaler(device.type, enabled=enabled, **policy)
    scaler = _shard_scaler_class()(device.type, **policy)
    scaler.scale(torch.zeros((), device=device))  # the scale on every rank, every stage's too
    return scaler


def _shard_scaler_class() -> type:
    from collections import defaultdict

    import torch
    from torch.distributed.tensor import DTensor

    class ShardScaler(torch.amp.GradScaler):
        """``GradScaler`` whose inf check reads each DTensor gradient's local shard and takes
        the largest over the world: every rank skips where any shard overflowed."""

        def _unscale_grads_(self, optimizer: Any, inv_scale: Any, found_inf: Any,
                            allow_fp16: bool) -> dict[Any, Any]:
            grouped: dict[tuple[Any, Any], list[Any]] = defaultdict(list)
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        grad = param.grad
                        if grad is None:
                            continue
                        local = grad.to_local() if isinstance(grad, DTensor) else grad
                        if not allow_fp16 and local.dtype == torch.float16:
                            raise ValueError("Attempting to unscale FP16 gradients.")
                        grouped[(local.device, local.dtype)].append(local)
                found: dict[Any, Any] = {}
                for (device, _), grads in grouped.items():
                    if device not in found:
                        found[device] = found_inf.to(device)
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        grads, found[device], inv_scale.to(device))
                if not found:  # an empty shard: this rank still joins the all-reduce
                    found[found_inf.device] = found_inf
                # The largest, not the sum: a fused optimizer skips where found_inf is 1.0 and
                # subtracts found_inf from its step counts.
                for flag in found.values():
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            return found

    return ShardScaler
