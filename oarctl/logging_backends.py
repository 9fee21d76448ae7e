"""Metrics sinks beside RUN_DIR/metrics.jsonl, chosen by `logging.backends`: TensorBoard, W&B.

metrics.jsonl stays the source of truth (report, compare and status read it; pipeline.run_loop
writes it whatever the backends), so the `jsonl` entry opens nothing. The others get the numeric
metrics of every step line (at x = step) and eval line (at x = steps trained) as run_loop appends
them. Their packages are optional: a backend asked for without its package is a one-line error
when the config is loaded, before any stage runs. A resumed run re-sends the lines of finished
steps: the TensorBoard sink skips the (metric, step) points its folder already holds, so each shows
once; W&B starts a new run on every invocation, which gets the whole history.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from oarctl.errors import OarError
from oarctl.registry import Registry

# backend name -> factory(logging config, run folder) -> sink with .log(metrics, step) and .close(), or None
BACKENDS: Registry = Registry("logging backend")
REQUIRED_PACKAGE = {"tensorboard": ("tensorboard", "pip install 'oarctl[tensorboard]'"),
                    "wandb": ("wandb", "pip install 'oarctl[wandb]'")}


def check_backends(names: list) -> None:
    """Called by config.validate: names known, and each one's optional package importable."""
    for name in names:
        if name not in BACKENDS:
            raise OarError(f"config: logging.backends: unknown {BACKENDS.kind} {name!r}; "
                           f"choose from: {', '.join(BACKENDS.names())}")
        package, install = REQUIRED_PACKAGE.get(name, (None, None))
        if package and importlib.util.find_spec(package) is None:
            raise OarError(f"config: logging.backends: {name} needs the {package!r} package ({install})")


def logged_points(folder: Path) -> set[tuple[str, int]]:
    """(metric, step) of every scalar already in a TensorBoard folder's event files."""
    if not folder.is_dir():
        return set()
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})  # 0: keep every point
    events.Reload()
    return {(tag, event.step) for tag in events.Tags()[SCALARS] for event in events.Scalars(tag)}


class TensorBoardSink:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter
        self.logged = logged_points(folder)  # a resumed run's earlier steps are there already
        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            if (key, step) not in self.logged:
                self.writer.add_scalar(key, value, global_step=step)
                self.logged.add((key, step))
        self.writer.flush()  # a killed run keeps what it logged

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, run_dir: Path):
        import wandb
        self.run = wandb.init(project=project or None, dir=str(run_dir), name=run_dir.name)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


@BACKENDS.register("jsonl")
def _jsonl(config, run_dir: Path):
    """RUN_DIR/metrics.jsonl, one line per step and evaluation (always written)."""
    return None  # pipeline.run_loop writes metrics.jsonl itself


@BACKENDS.register("tensorboard")
def _tensorboard(config, run_dir: Path):
    """TensorBoard event files in logging.tensorboard_dir (default RUN_DIR/tensorboard)."""
    return TensorBoardSink(Path(config.tensorboard_dir) if config.tensorboard_dir else run_dir / "tensorboard")


@BACKENDS.register("wandb")
def _wandb(config, run_dir: Path):
    """A Weights & Biases run in logging.wandb_project."""
    return WandbSink(config.wandb_project, run_dir)


def numeric(line: dict) -> dict:
    """The metrics of a metrics.jsonl line: numbers only, bookkeeping keys dropped."""
    return {k: float(v) for k, v in line.items()
            if k not in ("kind", "step", "after_steps") and isinstance(v, (int, float)) and not isinstance(v, bool)}


class MetricsSinks:
    """The open sinks of one run; `send(lines)` forwards the lines appended since the last call."""

    def __init__(self, config, run_dir: Path):
        self.sinks = [s for s in (BACKENDS.get(n)(config, run_dir) for n in dict.fromkeys(config.backends)) if s]
        self.sent = 0

    def send(self, lines: list[dict]) -> None:
        for line in lines[self.sent:]:
            step = line["step"] if line.get("kind") == "step" else line.get("after_steps", 0)
            for sink in self.sinks:
                sink.log(numeric(line), step)
        self.sent = len(lines)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
