"""A verify pool worker, started by `WorkerPool` as `python -m oarctl.verify.worker FD`.

A fresh interpreter rather than a multiprocessing child: spawn and forkserver children re-import
the caller's `__main__`, which re-runs a script without a main guard and fails for `python -`
(stdin) and notebooks. This process imports only oarctl and the checked function's module.

Protocol on the socket FD (multiprocessing Connection framing, pickled messages): the parent sends
(module, qualified name, sys.path entries to append, address-space cap in bytes); the worker
imports the function, caps its memory, answers "ready", then one item in, one ("ok" | "error",
value) out until the parent closes the socket.
"""
from __future__ import annotations

import importlib
import resource
import signal
import sys
from multiprocessing.connection import Connection


def _load(module: str, qualified_name: str):
    found = importlib.import_module(module)
    for part in qualified_name.split("."):
        found = getattr(found, part)
    return found


def serve(connection: Connection) -> None:
    module, qualified_name, extra_path, memory_bytes = connection.recv()
    # Appended, never prepended: the caller's folders (a test folder, a notebook's) can supply the
    # function's module but never shadow the standard library or installed packages.
    sys.path.extend(entry for entry in extra_path if entry not in sys.path)
    function = _load(module, qualified_name)  # imports the engine before the cap and before "ready"
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    connection.send("ready")
    while True:
        try:
            item = connection.recv()
        except EOFError:
            return
        try:
            connection.send(("ok", function(item)))
        except BaseException as error:  # noqa: BLE001 - any failure of untrusted input is a verdict
            connection.send(("error", f"{type(error).__name__}: {str(error)[:200]}"))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    serve(Connection(int(sys.argv[1])))


if __name__ == "__main__":
    main()
