"""The one table of the CLI's option constraints, checked before any command runs.

`oarctl.cli.user_errors` (which wraps every command) calls `check_options` with the parsed values,
so a bad value is one `error: --OPTION: ...` line and exit code 2 before anything is read or written.
Options are keyed by their parameter name, which means the same thing in every command (`step` is an
RL step index wherever it appears). A number option missing from the table still has to be >= 0
(`UNLISTED`), and tests/test_option_limits.py walks every option of every command, fails for one that
is not listed, and gives each listed one a bad value. Config keys (`--set section.key=...`) are
checked by oarctl.config.validate; boolean flags have no bad value.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from oarctl.errors import OarError


@dataclass(frozen=True)
class Number:
    minimum: float
    maximum: float | None = None
    above: bool = False  # strictly above the minimum

    def problem(self, value) -> str | None:
        low_ok = value > self.minimum if self.above else value >= self.minimum
        if low_ok and (self.maximum is None or value <= self.maximum):
            return None
        kind = "an integer" if isinstance(value, int) else "a number"
        bound = f"{'>' if self.above else '>='} {self.minimum:g}"
        if self.maximum is not None:
            bound = f"in {'(' if self.above else '['}{self.minimum:g}, {self.maximum:g}]"
        return f"expected {kind} {bound}, got {value}"


@dataclass(frozen=True)
class Choice:
    names: Callable[[], list[str]]  # the valid names, imported only when the option is given
    listed: bool = False  # a comma-separated list of names

    def problem(self, value) -> str | None:
        given = [part.strip() for part in str(value).split(",")] if self.listed else [value]
        valid = list(self.names())
        bad = [name for name in given if name not in valid] or ([""] if not any(given) else [])
        if not bad:
            return None
        return f"{bad[0]!r} is not one of {', '.join(valid)}" + (" (comma-separated)" if self.listed else "")


@dataclass(frozen=True)
class Existing:
    kind: str  # "file" or "folder"
    what: str  # what the user calls it: "config file"

    def problem(self, value) -> str | None:
        from pathlib import Path

        path = Path(value)
        if path.is_file() if self.kind == "file" else path.is_dir():
            return None
        return f"{path}: {self.what} not found" if not path.exists() else f"{path}: is not a {self.kind}"


@dataclass(frozen=True)
class Folder:
    """A folder the command creates when absent: anything but an existing file."""

    def problem(self, value) -> str | None:
        from pathlib import Path

        return f"{value}: is a file, expected a folder" if Path(value).is_file() else None


@dataclass(frozen=True)
class Override:
    """`--set section.key=value`: its form, a known option and a value of its type (the values
    together are checked when the config loads, oarctl.config.validate)."""

    def problem(self, value) -> str | None:
        from oarctl.config import check_override

        try:
            check_override(value)
        except OarError as error:
            return str(error).removeprefix("--set ")
        return None


@dataclass(frozen=True)
class Free:
    why: str  # why any value is accepted here (checked later, or created)

    def problem(self, value) -> str | None:
        return None


def _attribution_methods() -> list[str]:
    from oarctl.attribution import ATTRIBUTION_METHODS

    return ATTRIBUTION_METHODS.names()


def _heatmap_values() -> list[str]:
    from oarctl.report.tokens import VALUE_COLUMNS

    return list(VALUE_COLUMNS)


def _toy_families() -> list[str]:
    from oarctl.toy.pretrain import RECIPES

    return list(RECIPES)


OPTIONS = {
    "step": Number(0),                 # an RL step index
    "steps": Number(1),                # RL steps of a run
    "rows": Number(1),                 # rows `show` prints
    "row": Number(0),                  # a row index
    "count": Number(1),                # prompts `toy prompts` writes
    "sample_size": Number(1),          # rollouts `fidelity` draws
    "batch_prompts": Number(1),        # prompts per batch `gradient-check` scores
    "sample_seconds": Number(0, above=True),  # seconds the sample stage took (`gradient-check`)
    "time_sampling": Number(0),        # prompts sampled again to time sampling (`gradient-check`; 0: off)
    "seed": Number(0),
    "time_limit": Number(0, above=True),
    "target": Number(0, 1, above=True),  # a held-out accuracy
    "split": Choice(lambda: ["train", "heldout"]),
    "family": Choice(_toy_families),
    "by": Choice(_heatmap_values),
    "method": Choice(_attribution_methods),
    "methods": Choice(_attribution_methods, listed=True),
    "config": Existing("file", "config file"),
    "policy": Existing("folder", "policy directory"),
    "set": Override(),
    "output": Free("an output path: a file, or the policy folder `update` writes; its folder is created"),
    "run_dir": Folder(),
    "state": Folder(),
}
UNLISTED = Number(0)  # a number option nobody listed yet (the test asks for it to be listed)


def flag(name: str, default) -> str:
    """The option's longest spelling (`--rows` for `-n/--rows`), as the user may have typed it."""
    declared = [d for d in getattr(default, "param_decls", None) or () if d.startswith("-")]
    spelled = [part for d in declared for part in d.split("/")]
    return max(spelled, key=len) if spelled else "--" + name.replace("_", "-")


def check_options(command: Callable, values: dict) -> None:
    """Raise OarError naming the option for the first value the table refuses."""
    for name, parameter in inspect.signature(command).parameters.items():
        value = values.get(name)
        # Typer makes a parameter with a default an option (typer.Option or a plain default), any other an argument
        argument = parameter.default is inspect.Parameter.empty or type(parameter.default).__name__ == "ArgumentInfo"
        if value is None or isinstance(value, bool) or argument:
            continue
        rule = OPTIONS.get(name)
        if rule is None and isinstance(value, (int, float)):
            rule = UNLISTED
        for item in value if isinstance(value, list) else [value]:
            problem = rule.problem(item) if rule is not None else None
            if problem:
                raise OarError(f"{flag(name, parameter.default)}: {problem}")
