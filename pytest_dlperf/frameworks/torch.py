"""PyTorch: torchvision's ResNet-50 (v1.5) under DistributedDataParallel.

Runs inside a worker rank. ``torch`` is imported in ``build_trainer`` only, so that the plugin can
read ``DISTRIBUTION`` without paying for a torch import.
"""

from __future__ import annotations

from typing import Any

from . import DeviceUnavailable, DistEnv

DISTRIBUTION = "torch"

# The models this adapter trains: their names here -> the zoo's builder.
MODELS = {"resnet50": "resnet50"}


class TorchTrainer:
    def __init__(self, spec: dict[str, Any], dist: DistEnv) -> None:
        import torch
        import torchvision

        self._torch = torch
        self.dist = dist
        self.cuda = spec["device_type"] == "cuda"
        torch.set_num_threads(int(spec["threads"]))
        if self.cuda:
            if dist.local_rank >= torch.cuda.device_count():
                raise DeviceUnavailable(
                    f"the case runs on CUDA (NVML found GPUs) but torch {torch.__version__} "
                    f"(CUDA build: {torch.version.cuda or 'none'}) sees "
                    f"{torch.cuda.device_count()} GPU(s) and this rank has local rank "
                    f"{dist.local_rank}; install a CUDA build of torch or run with "
                    "--dlperf-device cpu")
            torch.cuda.set_device(dist.local_rank)
            self.device = torch.device("cuda", dist.local_rank)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")
        if dist.world_size > 1:
            torch.distributed.init_process_group(backend="nccl" if self.cuda else "gloo")
        torch.manual_seed(int(spec["seed"]) + dist.rank)

        model = getattr(torchvision.models, MODELS[spec["model"]])(num_classes=int(spec["num_classes"]))
        memory_format = torch.channels_last if self.cuda else torch.contiguous_format
        model = model.to(self.device, memory_format=memory_format)
        self.parameters = sum(p.numel() for p in model.parameters())
        if dist.world_size > 1:
            # Gradients as views into the all-reduce buckets: no copy in and out of them.
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[dist.local_rank] if self.cuda else None,
                gradient_as_bucket_view=True,
            )
        self.model = model
        self.compiled = spec.get("compiler", "eager") == "compiled"
        # torch.compile (inductor) of the whole model, DDP included (its graph breaks at the
        # all-reduce buckets): the first step traces and compiles, the warm-up absorbs it.
        self.forward = torch.compile(model) if self.compiled else model
        opt = spec["optimizer"]
        # Fused on CUDA: one kernel for the whole update, and GradScaler hands it the inf check
        # on the device (an unfused optimizer makes GradScaler.step read found_inf on the host:
        # a device sync in every AMP step).
        self.optimizer = torch.optim.SGD(
            model.parameters(), lr=opt["lr"], momentum=opt["momentum"],
            weight_decay=opt["weight_decay"], fused=self.cuda or None,
        )
        self.criterion = torch.nn.CrossEntropyLoss()

        batch, size = int(spec["batch_size"]), int(spec["image_size"])
        # Synthetic data resident on the device, as DLPerf's synthetic-data runs: the input
        # pipeline is not what is being measured.
        self.images = torch.randn(batch, 3, size, size, device=self.device).contiguous(
            memory_format=memory_format)
        self.num_classes = int(spec["num_classes"])
        self.labels = torch.randint(0, self.num_classes, (batch,), device=self.device)

        self.amp = spec["precision"] == "amp"
        self.amp_dtype = torch.float16 if self.cuda else torch.bfloat16
        # fp16 needs loss scaling; bf16 has fp32's exponent range and does not.
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.cuda)
        self._loss = torch.zeros((), device=self.device)

    def step(self) -> None:
        torch = self._torch
        # Fresh labels each step (one tiny kernel): a fixed batch is memorized within a few
        # steps, after which logits grow without bound and fp16/bf16 runs end in NaN.
        torch.randint(0, self.num_classes, self.labels.shape, out=self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            loss = self.criterion(self.forward(self.images), self.labels)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._loss = loss.detach()

    def synchronize(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize(self.device)

    def loss(self) -> float:
        return float(self._loss.float().item())

    def environment(self) -> dict[str, Any]:
        torch = self._torch
        env: dict[str, Any] = {
            "framework": "torch",
            "framework_version": torch.__version__,
            "threads": torch.get_num_threads(),
            "parameters": self.parameters,
            "compiled": self.compiled,
            # The ranks the process group really joined: what data parallelism spans.
            "data_parallel_ranks": (torch.distributed.get_world_size()
                                    if torch.distributed.is_initialized() else 1),
        }
        if self.cuda:
            env.update(
                channels_last=self.images.is_contiguous(memory_format=torch.channels_last),
                cudnn_benchmark=torch.backends.cudnn.benchmark,
                fused_optimizer=True,
                device_name=torch.cuda.get_device_name(self.device),
                cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                nccl=".".join(map(str, torch.cuda.nccl.version())),
            )
        return env

    def close(self) -> None:
        if self._torch.distributed.is_initialized():
            self._torch.distributed.destroy_process_group()


def compile_unavailable(device_type: str) -> str | None:
    """Why torch.compile cannot run here, or None. Inductor builds C++ kernels on CPU and
    Triton kernels on CUDA."""
    import shutil

    if device_type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        return "inductor needs a C++ compiler (g++) on CPU and none is on PATH"
    return None


def build_trainer(spec: dict[str, Any], dist: DistEnv) -> TorchTrainer:
    return TorchTrainer(spec, dist)
