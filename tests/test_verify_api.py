"""The grading page's Python API example (docs/grading.md), run as a user would: saved as a plain script
without a main guard, fed through `python -`, and given to `python -c`. Each printed line must equal the comment on its line.

Before the pool's workers were fresh interpreters, both failed with "verify worker failed to start"
as soon as a pair needed the engine (`2\\sqrt{2}` vs `\\sqrt{8}`): spawned workers re-imported the
caller's main module.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.compile(r"```python\n(from oarctl\.verify import .*?)```", re.DOTALL)


def readme_example() -> str:
    found = EXAMPLE.search((ROOT / "docs" / "grading.md").read_text())
    assert found, "docs/grading.md has no `from oarctl.verify import` Python block"
    return found.group(1)


def expected_lines(code: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]


def environment() -> dict[str, str]:
    """This checkout's oarctl first, whatever is installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("how", ["file", "stdin", "-c", "beside another oarctl"])
def test_readme_example_runs_without_a_main_guard(tmp_path, how):
    code = readme_example()
    assert "__main__" not in code
    folder = tmp_path
    if how == "beside another oarctl":  # a stale copy in the working directory never reaches a worker
        folder = tmp_path / "elsewhere"
        (folder / "oarctl").mkdir(parents=True)
        (folder / "oarctl" / "__init__.py").write_text("raise ImportError('the wrong oarctl')\n")
        how = "file"
    if how == "file":
        script = tmp_path / "example.py"
        script.write_text(code)
        command, stdin = [sys.executable, str(script)], None
    elif how == "stdin":
        command, stdin = [sys.executable, "-"], code
    else:
        command, stdin = [sys.executable, "-c", code], None
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=folder,
                            env=environment(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected_lines(code)
