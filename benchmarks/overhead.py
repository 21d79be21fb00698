"""Plugin overhead: the same training loop timed by hand and through pytest-dlperf, in one run.

Usage::

    .venv/bin/python benchmarks/overhead.py [--steps 20] [--warmup 5] [--repeats 5] [--rounds 3]
                                            [--image-size 64] [--batch-size 2]
                                            [--framework torch|tensorflow]
                                            [--model resnet50|mlp] [--width 256]

``--model mlp`` (torch) trains a small user workload instead, an MLP (width -> 4 x width -> 10,
batch 64) whose step takes a few milliseconds here: there the harness's per-step cost matters far
more than on ResNet-50. The plugin side is written as a user writes it (a ``Workload`` with a
recipe in the generated test file, README "Your own model"); its windows default to 500 steps.

Method. Both sides train torchvision's ResNet-50 on CPU (fp32, one process, synthetic images
resident in memory, fresh random labels every step, SGD with momentum) with the same thread count,
the one the plugin gives a single worker: every usable core.

- *By hand*: a fresh ``python benchmarks/overhead.py --hand-worker`` process runs a plain PyTorch
  loop written here, independently of the plugin (it never imports ``pytest_dlperf``): ``warmup``
  untimed steps, then ``repeats`` windows of ``steps`` steps, each timed with
  ``time.perf_counter``.
- *Through the plugin*: ``pytest`` in a subprocess on a generated one-line test that calls
  ``throughput_meter.measure("torch", ...)``. That is the whole path a user gets: plugin ->
  torchrun elastic agent -> ``pytest_dlperf.rank.worker`` -> torch adapter -> meter. Its per-window
  samples/s come from the ``--dlperf-json`` results file.

``--live-progress`` compares the plugin with itself instead: a run showing live progress (no
``-q``: rank 0 appends every warm-up step and window to its progress file, pytest's thread follows
it and prints a line per window) against a run under ``-q`` (no progress file at all), with the
same alternation. Its ratio is what the live progress costs the timed windows.

``--framework tensorflow`` does the same for TensorFlow: the hand side is a plain ``tf.function``
SGD step written here around the adapter's Keras ResNet-50 v1.5 (the workload definition; Keras
ships only v1), waiting for each window's last loss; the plugin side is ``measure("tensorflow")``.

Each side reports one samples/s figure per timed window; the benchmark compares the median of all
windows of each side, and prints ``plugin / hand`` against the goal (>= 0.99).

Why interleave. On a shared or thermally limited machine throughput drifts by more than the 1%
being measured, over minutes. Running all hand rounds and then all plugin rounds would fold that
drift into the ratio. Instead the sides alternate, round after round, and the order flips every
round (hand, plugin, plugin, hand, hand, plugin, ...), so a slow phase or a steady trend hits both
sides alike instead of whichever happened to run second.

It is a benchmark, not a test: it exits 0 whether the ratio meets the goal or not (non-zero only
when a run fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

GOAL = 0.99
NUM_CLASSES = 1000
HAND, PLUGIN = "hand", "plugin"
QUIET, LIVE = "quiet", "live"  # --live-progress: the plugin under -q, and showing progress


# --------------------------------------------------------------------------- by hand (subprocess)

def hand_worker(args: argparse.Namespace) -> int:
    """The plain loop, in its own process. Prints one JSON line: per-window samples/s."""
    if args.framework == "tensorflow":
        return hand_worker_tensorflow(args)
    import torch
    import torchvision

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == "mlp":  # the small user workload: a ~ms step, fixed batch
        width = args.width
        model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, 10))
        classes, weight_decay = 10, 0.0
        images = torch.randn(args.batch_size, width)
    else:
        model = torchvision.models.resnet50(num_classes=NUM_CLASSES)
        classes, weight_decay = NUM_CLASSES, 1e-4
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * args.batch_size / 256,
                                momentum=0.9, weight_decay=weight_decay)
    criterion = torch.nn.CrossEntropyLoss()
    labels = torch.randint(0, classes, (args.batch_size,))
    fresh_labels = args.model != "mlp"

    def step() -> torch.Tensor:
        if fresh_labels:
            torch.randint(0, NUM_CLASSES, labels.shape, out=labels)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        return cast(torch.Tensor, loss)  # nn.Module's __call__ is typed Any

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.repeats):
        begin = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        rates.append(args.batch_size * args.steps / (time.perf_counter() - begin))
    assert "pytest_dlperf" not in sys.modules, "the hand loop must not use the plugin"
    print(json.dumps({"samples_per_s": rates, "threads": torch.get_num_threads(),
                      "torch": torch.__version__, "last_loss": float(loss)}))
    return 0


def hand_worker_tensorflow(args: argparse.Namespace) -> int:
    """The same by hand in TensorFlow: a plain tf.function SGD step. The model *definition* is
    the adapter's Keras ResNet-50 v1.5 (that is the workload, not the harness: Keras ships only
    v1); nothing of the plugin's launching, metering or reporting is used."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import tensorflow as tf

    from pytest_dlperf.models.resnet50.tensorflow import resnet50_v15

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if args.threads == 1 else 2)
    tf.random.set_seed(0)
    model = resnet50_v15(NUM_CLASSES, args.image_size)
    import keras

    optimizer = keras.optimizers.SGD(learning_rate=0.1 * args.batch_size / 256, momentum=0.9)
    images = tf.Variable(tf.random.normal((args.batch_size, args.image_size, args.image_size, 3)),
                         trainable=False)

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no annotations
    def step() -> tf.Tensor:
        labels = tf.random.uniform((args.batch_size,), 0, NUM_CLASSES, dtype=tf.int32)
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, model(images, training=True)))
        grads = tape.gradient(loss, variables)
        grads = [g + 1e-4 * v for g, v in zip(grads, variables)]
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    for _ in range(args.warmup):
        loss = step()
    loss.numpy()
    rates = []
    for _ in range(args.repeats):
        begin = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss.numpy()  # wait for the window's last step, as the meter does
        rates.append(args.batch_size * args.steps / (time.perf_counter() - begin))
    assert "pytest_dlperf.rank.timing" not in sys.modules and "pytest_dlperf.rank.worker" not in sys.modules
    print(json.dumps({"samples_per_s": rates, "threads": args.threads,
                      "torch": f"tensorflow {tf.__version__}", "last_loss": float(loss)}))
    return 0


# --------------------------------------------------------------------------- the two sides

def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def clean_env(threads: int) -> dict[str, str]:
    """This environment, minus anything that would reconfigure pytest or the plugin."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DLPERF_") and k != "PYTEST_ADDOPTS"}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_checked(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{tail}")
    return proc.stdout


def run_hand(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--hand-worker",
           "--threads", str(args.threads), "--framework", args.framework, *protocol_args(args)]
    out = run_checked(cmd, clean_env(args.threads))
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return figures


TEST_FILE = """\
def test_case(throughput_meter):
    throughput_meter.measure("{framework}", "resnet50", batch_size={batch},
                             sizes={{"image_size": {size}}})
"""

# The small user workload, as a user writes it (README "Your own model"): the same MLP, batch and
# optimizer as the hand loop's.
MLP_TEST_FILE = """\
import torch

from pytest_dlperf import SGD, Parts, Workload


def build(ctx):
    width = int(ctx.sizes["width"])
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, 10))
    return Parts(model=model, inputs=torch.randn(ctx.batch_size, width),
                 targets=torch.randint(0, 10, (ctx.batch_size,)))


MLP = Workload("mlp", recipes={{"torch": build}}, batch_size={batch}, sizes={{"width": {width}}},
               optimizer=SGD(lr_per_256=0.1, momentum=0.9, weight_decay=0.0))


def test_case(throughput_meter):
    throughput_meter.measure("torch", MLP)
"""


def run_plugin(args: argparse.Namespace, work: Path, index: int,
               live: bool = False) -> dict[str, Any]:
    test = work / "test_overhead.py"
    if args.model == "mlp":
        test.write_text(MLP_TEST_FILE.format(batch=args.batch_size, width=args.width))
    else:
        test.write_text(TEST_FILE.format(framework=args.framework, batch=args.batch_size,
                                         size=args.image_size))
    out_json = work / f"results-{index}.json"
    # -q turns the live progress off; without it (output to a pipe here) rank 0 writes every
    # warm-up step and window to its progress file and pytest prints a line per window.
    cmd = [sys.executable, "-m", "pytest", str(test), *([] if live else ["-q"]),
           "-p", "no:cacheprovider",
           # A test naming only throughput_meter is one fp32 case; "not amp" guards against an
           # amp axis, should the fixture ever sweep it.
           "-k", "not amp", "--dlperf-device", "cpu", "--devices-per-node", "1",
           "--dlperf-warmup-steps", str(args.warmup), "--dlperf-steps", str(args.steps),
           "--dlperf-repeats", str(args.repeats), "--dlperf-json", str(out_json),
           "--dlperf-baselines", str(work / "b")]
    output = run_checked(cmd, clean_env(args.threads), cwd=work)
    benches = json.loads(out_json.read_text())["benchmarks"]
    if len(benches) != 1:
        raise RuntimeError(f"expected one case in {out_json}, got {len(benches)}")
    info = benches[0]["extra_info"]
    shown, windows = output.count(": window "), len(info["samples_per_s_repeats"])
    if shown != (windows if live else 0):
        raise RuntimeError(f"expected {windows if live else 0} live window lines, got "
                           f"{shown}:\n{output[-2000:]}")
    if info["precision"] != "fp32" or info["topology"]["world_size"] != 1:
        raise RuntimeError(f"expected one fp32 process, got {info['precision']} on "
                           f"{info['topology']['id']}")
    env = info["environment"]
    threads = env["threads"] if args.framework == "torch" else args.threads
    version = env["framework_version"]
    return {"samples_per_s": info["samples_per_s_repeats"], "threads": threads,
            "torch": version if args.framework == "torch" else f"tensorflow {version}"}


def protocol_args(args: argparse.Namespace) -> list[str]:
    return ["--warmup", str(args.warmup), "--steps", str(args.steps),
            "--repeats", str(args.repeats), "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--model", args.model,
            "--width", str(args.width)]


# --------------------------------------------------------------------------- rounds and report

@dataclass
class Side:
    name: str
    windows: list[float] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)
    torch: set[str] = field(default_factory=set)

    def add(self, run: dict[str, Any]) -> None:
        self.windows.extend(float(x) for x in run["samples_per_s"])
        self.threads.add(int(run["threads"]))
        self.torch.add(str(run["torch"]))

    @property
    def median(self) -> float:
        return statistics.median(self.windows)


def order(round_index: int, first: str = HAND, second: str = PLUGIN) -> tuple[str, str]:
    """hand, plugin | plugin, hand | hand, plugin ...: each side runs first every other round."""
    return (first, second) if round_index % 2 == 0 else (second, first)


def run_rounds(args: argparse.Namespace) -> dict[str, Side]:
    first, second = (QUIET, LIVE) if args.live_progress else (HAND, PLUGIN)
    sides = {first: Side(first), second: Side(second)}
    with tempfile.TemporaryDirectory(prefix="dlperf-overhead-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for name in order(r, first, second):
                started = time.perf_counter()
                run = (run_hand(args) if name == HAND
                       else run_plugin(args, work, r, live=name == LIVE))
                sides[name].add(run)
                rates = ", ".join(f"{x:.2f}" for x in run["samples_per_s"])
                took = time.perf_counter() - started
                print(f"round {r + 1}/{args.rounds} {name:<6} {took:6.1f} s"
                      f"  samples/s per window: {rates}", flush=True)
    return sides


def report(args: argparse.Namespace, sides: dict[str, Side]) -> None:
    hand, plugin = sides.values()
    print()
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {cpu_model()}, {usable_cores()} usable cores; "
          f"{', '.join(sorted(hand.torch | plugin.torch))}")
    what = (f"MLP {args.width}-{4 * args.width}-10" if args.model == "mlp" else
            f"resnet50 v1.5, {args.image_size}x{args.image_size}")
    print(f"workload: {args.framework} {what} fp32 on CPU, batch {args.batch_size}; "
          f"{args.warmup} warm-up + {args.repeats} windows x {args.steps} "
          f"steps per run; {args.rounds} round(s), sides alternating")
    print()
    header = f"{'side':<7} {'median samples/s':>17} {'min-max':>17} {'windows':>8} {'threads':>8}"
    print(header)
    print("-" * len(header))
    for side in (hand, plugin):
        spread = f"{min(side.windows):.2f}-{max(side.windows):.2f}"
        threads = ",".join(str(t) for t in sorted(side.threads))
        print(f"{side.name:<7} {side.median:>17.2f} {spread:>17} {len(side.windows):>8} "
              f"{threads:>8}")
    if hand.threads != plugin.threads:
        print(f"warning: thread counts differ (hand {sorted(hand.threads)}, "
              f"plugin {sorted(plugin.threads)}): the ratio compares unlike runs")
    ratio = plugin.median / hand.median
    print()
    verdict = "PASS" if ratio >= GOAL else "BELOW"
    print(f"ratio {plugin.name}/{hand.name}: {ratio:.4f} (goal >= {GOAL}): {verdict}")
    floor_s = meter_floor()
    step_s = args.batch_size / hand.median
    print(f"meter floor: {floor_s * 1e9:.0f} ns per step with a no-op step; against this "
          f"{step_s * 1e3:.2f} ms step the meter's own share bounds the ratio at "
          f"{step_s / (step_s + floor_s):.6f}")
    print("(end-to-end ratios move by several percent between runs here: window CV 5-10% and "
          "drift between runs; read the floor as what the harness itself costs per step)")


def meter_floor(steps: int = 200_000, repeats: int = 5) -> float:
    """Seconds the meter itself adds per step: its timed loop around a step that does nothing.
    Imported only here, so the hand-worker side never touches the plugin."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pytest_dlperf.core.protocol import Protocol
    from pytest_dlperf.rank.timing import measure

    result = measure(Protocol(0, steps, repeats), lambda: None, lambda: None)
    return statistics.median(w.elapsed_s for w in result.windows) / steps


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per run (default 5)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed window (default 20; 500 for --model mlp)")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows per run (default 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="hand/plugin pairs of runs, interleaved (default 3)")
    parser.add_argument("--image-size", type=int, default=64,
                        help="image side in pixels (default 64)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch per step (default 2; 64 for --model mlp)")
    parser.add_argument("--model", choices=("resnet50", "mlp"), default="resnet50",
                        help="resnet50, or mlp: a small user workload (torch) whose step takes "
                             "a few ms, where the harness's per-step cost shows most")
    parser.add_argument("--width", type=int, default=256,
                        help="the MLP's input width (hidden: 4x; default 256)")
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch",
                        help="which framework both sides train (default torch)")
    parser.add_argument("--live-progress", action="store_true",
                        help="compare the plugin with live progress shown (a line per window, "
                             "rank 0 writing its phases) against the plugin under -q (none), "
                             "instead of the plugin against the hand loop")
    parser.add_argument("--hand-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=usable_cores(), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mlp = args.model == "mlp"
    if mlp and args.framework != "torch":
        parser.error("--model mlp is torch only")
    if args.steps is None:
        args.steps = 500 if mlp else 20
    if args.batch_size is None:
        args.batch_size = 64 if mlp else 2
    for name in ("width", "steps", "repeats", "rounds", "image_size", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.hand_worker:
        return hand_worker(args)
    try:
        sides = run_rounds(args)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    report(args, sides)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
