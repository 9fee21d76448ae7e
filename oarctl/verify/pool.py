"""A process pool with a hard per-item timeout and memory cap, for untrusted symbolic work.

Each worker is a fresh interpreter, `python -m oarctl.verify.worker` (no forked torch or thread
state, and the caller's main module is never imported, so plain scripts, `python -` and notebooks
work), that caps its own address space, then serves one item at a time over a socket pair. An
item that runs past its deadline gets its worker killed; a worker that dies (segfault, out of
memory) is detected by its closed socket. Either way the item gets an outcome, a fresh worker takes
the slot, and the batch goes on. Workers start lazily, on the first item or earlier on `start()`
(so their import overlaps the caller's own work), no more of them than the batch is worth
(`items_per_worker`) until an item turns out slow, and stop on `close()` (context manager, and
atexit as a last resort).
"""
from __future__ import annotations

import atexit
import math
import os
import socket
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable

import oarctl
from oarctl.errors import OarError

STARTUP_SECONDS = 60.0  # importing the engine in a fresh process, on a busy machine
# An item running this long makes the batch worth every worker, whatever `items_per_worker` says
# (a math check takes ~10 ms; one that runs into its timeout must not hold up the others).
SLOW_ITEM_SECONDS = 1.0
_LIVE_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@dataclass(frozen=True)
class Outcome:
    status: str          # "ok", "timeout" or "error"
    value: Any           # the function's result when ok, else a one-line reason
    latency_ms: float


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _function_reference(function: Callable | str) -> tuple[str, str]:
    """(module, qualified name): what a worker imports, since it shares no memory with this process.
    A "module:name" string names the function without importing it here."""
    if isinstance(function, str):
        module, _, name = function.partition(":")
        return module, name
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise OarError(f"verify pool: {name or function!r} must be a module-level function of an importable "
                       "module (a worker never imports the caller's main script)")
    return module, name


# The folder holding this very oarctl: the workers' working directory, hence the first entry of
# their sys.path under `-m`, so they run this code and not another copy found in the caller's folder.
OARCTL_ROOT = str(Path(oarctl.__file__).resolve().parent.parent)


class _Worker:
    def __init__(self, reference: tuple[str, str], memory_bytes: int):
        if not sys.executable:
            raise OarError("verify pool: no Python executable to start workers with (sys.executable is empty)")
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "oarctl.verify.worker", str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=OARCTL_ROOT, close_fds=True)
        theirs.close()
        self.connection = Connection(ours.detach())
        # absolute, since the worker runs in another folder ('' is this process's working directory)
        self.connection.send((*reference, [os.path.abspath(p) for p in sys.path], memory_bytes))
        self.started = time.perf_counter()

    def confirm_ready(self) -> None:
        """Read the start-up message once the connection is readable; a worker that died instead
        (an import error: its traceback is on stderr) makes the whole pool unusable."""
        try:
            message = self.connection.recv()
        except (EOFError, OSError):
            message = None
        if message != "ready":
            self.stop()
            raise OarError(f"verify worker failed to start (exit code {self.process.returncode})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.connection.close()

    def exit_code(self, grace: float = 1.0) -> int | None:
        """The exit code of a worker whose pipe closed (negative: killed by that signal)."""
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            return None


class WorkerPool:
    def __init__(self, function: Callable | str, *, workers: int, timeout: float, memory_mb: int,
                 items_per_worker: int = 1):
        """`items_per_worker`: a batch of n items starts at most ceil(n / items_per_worker) new
        workers (started ones are always used): a fresh worker costs its import and warm-up, about a
        CPU-second for the math engine, which a few items do not repay on a shared machine."""
        self.reference, self.timeout = _function_reference(function), timeout
        self.size = workers or available_cores()
        self.memory_bytes = memory_mb * 2 ** 20
        self.items_per_worker = items_per_worker
        self._idle: list[_Worker] = []
        self._starting: list[_Worker] = []  # started by `start()`, not yet taken by `map`
        self.replaced = 0  # workers killed or found dead, for metrics and tests
        _LIVE_POOLS.add(self)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, count: int = 1) -> None:
        """Start up to `count` workers (within the pool size) without waiting for them: they import
        the engine while the caller goes on, and the next `map` takes them."""
        for _ in range(min(count, self.size) - len(self._idle) - len(self._starting)):
            self._starting.append(_Worker(self.reference, self.memory_bytes))

    def _capacity(self, items: int) -> int:
        """Workers for a batch: every started one, plus new ones only as the batch is worth them."""
        started = len(self._idle) + len(self._starting)
        return min(self.size, items, max(started, math.ceil(items / self.items_per_worker)))

    def map(self, items: list) -> list[Outcome]:
        """One outcome per item, in order; never raises because of an item.

        Workers start without blocking: items go to the workers that are ready while the others
        (and replacements of killed ones) are still importing, so a replacement's start-up never
        delays another item's deadline.
        """
        outcomes: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        capacity, full = self._capacity(len(items)), min(self.size, len(items))
        free, self._idle = self._idle[:capacity], self._idle[capacity:]
        starting: dict[Any, _Worker] = {worker.connection: worker for worker in self._starting}
        self._starting = []
        busy: dict[Any, tuple[_Worker, int, float]] = {}  # connection -> (worker, item, started)
        try:
            while pending or busy:
                if capacity < full and pending and self._slow(busy):
                    capacity = full
                for _ in range(min(capacity - len(free) - len(busy) - len(starting), len(pending))):
                    worker = _Worker(self.reference, self.memory_bytes)
                    starting[worker.connection] = worker
                while free and pending:
                    worker, index = free.pop(), pending.popleft()
                    worker.connection.send(items[index])
                    busy[worker.connection] = (worker, index, time.perf_counter())
                self._wait(busy, starting, free, outcomes, watch_slow=capacity < full and bool(pending))
        finally:
            for worker in [w for w, _, _ in busy.values()] + list(starting.values()):
                worker.stop()  # only after an exception in this process, or workers still starting
            self._idle.extend(free)
        return outcomes

    @staticmethod
    def _slow(busy: dict) -> bool:
        now = time.perf_counter()
        return any(now - started >= SLOW_ITEM_SECONDS for _, _, started in busy.values())

    def _wait(self, busy: dict, starting: dict, free: list, outcomes: list, watch_slow: bool = False) -> None:
        """Collect results and start-ups that arrive before the nearest deadline, then kill the
        workers past theirs."""
        deadlines = [started + self.timeout for _, _, started in busy.values()]
        deadlines += [worker.started + STARTUP_SECONDS for worker in starting.values()]
        if watch_slow:  # wake up when an item turns slow, to start more workers
            deadlines += [started + SLOW_ITEM_SECONDS for _, _, started in busy.values()]
        ready = wait(list(busy) + list(starting), timeout=max(0.0, min(deadlines) - time.perf_counter()))
        for connection in ready:
            if connection in starting:
                worker = starting.pop(connection)
                worker.confirm_ready()
                free.append(worker)
                continue
            worker, index, started = busy.pop(connection)
            try:
                status, value = connection.recv()
                free.append(worker)
            except (EOFError, OSError):
                status, value = "error", f"worker died (exit code {worker.exit_code()})"
                self._discard(worker)
            outcomes[index] = Outcome(status, value, (time.perf_counter() - started) * 1e3)
        now = time.perf_counter()
        for connection in [c for c, (_, _, started) in busy.items() if now - started >= self.timeout]:
            worker, index, started = busy.pop(connection)
            outcomes[index] = Outcome("timeout", f"no answer within {self.timeout:g} s", (now - started) * 1e3)
            self._discard(worker)
        for connection in [c for c, w in starting.items() if now - w.started >= STARTUP_SECONDS]:
            starting.pop(connection).stop()
            raise OarError(f"verify worker did not start within {STARTUP_SECONDS:.0f} s")

    def _discard(self, worker: _Worker) -> None:
        """Stop a hung or dead worker; `map` starts a replacement when there is work for it."""
        worker.stop()
        self.replaced += 1

    def close(self) -> None:
        for worker in self._idle + self._starting:
            worker.stop()
        self._idle, self._starting = [], []


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()
