"""Every snippet of the README and of the documentation site runs, so a snippet that stops fails CI.

A page's ```python snippets always run; its ```bash snippets run unless their first line marks them
(`# gpu: ...`, `# long: ...`, `# fragment: ...`; docs/about-docs.md states the convention). A page's
snippets run in order in a scratch folder of the page's own, with `configs/` and `examples/` of the
checkout beside them and the checkout's `oarctl` first on the paths, so they run on the toy policy
offline. Every `oarctl` command line of every bash snippet, run or not, is also parsed by the real
command line and its `-c` / `--set` loaded by the real config loader, which is cheap and catches a
renamed command or option in snippets that cannot run here. Reads only the repository.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
MARKERS = ("gpu", "long", "fragment")
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^#\s*(%s):" % "|".join(MARKERS))
BESIDE = ("configs", "examples")  # checkout folders a snippet names by relative path
# Every page's runs/ is one folder, so a run that two pages both make (configs/quick.yaml) is made once
# and found up to date the second time: the commands still run, the training does not run twice.
SNIPPET_TIMEOUT = 600


@dataclass
class Snippet:
    page: str
    line: int  # of the opening fence
    language: str  # python or bash
    code: str

    @property
    def marker(self) -> str | None:
        found = MARKER.match(self.code.lstrip("\n").split("\n", 1)[0])
        return found.group(1) if found else None

    @property
    def runs(self) -> bool:
        return self.language == "python" or self.marker is None


def snippets(text: str, page: str = "page") -> list[Snippet]:
    """The python and bash fences of a markdown page, in order (other fences are shown, never run)."""
    found, opened, language, body = [], None, "", []
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None and fence:
            opened, language, body = number, fence.group(1).lower(), []
        elif opened is not None and line.rstrip() == "```":
            if language in LANGUAGES:
                found.append(Snippet(page, opened, LANGUAGES[language], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    return found


def pages() -> list[Path]:
    """The README and every page of the site but the generated reference (which holds no snippet)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md"] + docs


def page_snippets() -> dict[str, list[Snippet]]:
    return {str(p.relative_to(ROOT)): snippets(p.read_text(), str(p.relative_to(ROOT))) for p in pages()}


def environment() -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "NO_COLOR": "1", "MPLBACKEND": "Agg", "TRL_EXPERIMENTAL_SILENCE": "1"}


def run_snippet(snippet: Snippet, folder: Path) -> subprocess.CompletedProcess:
    if snippet.language == "python":
        script = folder / f".snippet_{snippet.line}.py"
        script.write_text(snippet.code)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-euo", "pipefail", "-c", snippet.code]
    return subprocess.run(command, cwd=folder, env=environment(), capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT)


def run_page(found: list[Snippet], folder: Path, runs: Path | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in BESIDE:
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name)
    if runs is not None and not (folder / "runs").exists():
        runs.mkdir(parents=True, exist_ok=True)
        (folder / "runs").symlink_to(runs)
    for snippet in found:
        if not snippet.runs:
            continue
        result = run_snippet(snippet, folder)
        output = (result.stdout + result.stderr)[-3000:]
        assert result.returncode == 0, (f"{snippet.page}:{snippet.line}: the {snippet.language} snippet "
                                        f"exited {result.returncode}:\n{output}")


RUNNABLE = {page: found for page, found in page_snippets().items() if any(s.runs for s in found)}


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.mark.parametrize("page", sorted(RUNNABLE, key=lambda page: page != "README.md"))
def test_the_page_snippets_run(page, tmp_path, shared_runs):
    run_page(RUNNABLE[page], tmp_path / "work", shared_runs)


def test_python_snippets_are_never_marked_to_skip():
    marked = [f"{s.page}:{s.line}" for found in page_snippets().values() for s in found
              if s.language == "python" and s.marker]
    assert marked == [], "a Python snippet always runs: make it run on the toy policy"


# ---- every oarctl command line, run or not, parses -----------------------------------------------------

SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"^\w+=")


def oarctl_command_lines(code: str) -> list[list[str]]:
    """The argument lists of every `oarctl ...` (or `... -m oarctl.cli ...`) command in a bash snippet."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote inside a loop body or a heredoc: not a command line
            continue
        segment: list[str] = []
        for word in words + [";"]:
            if word not in SHELL_OPERATORS:
                segment.append(word)
                continue
            while segment and ASSIGNMENT.match(segment[0]):
                segment = segment[1:]
            if segment[:1] == ["oarctl"]:
                found.append(segment[1:])
            elif "oarctl.cli" in segment and segment[segment.index("oarctl.cli") - 1] == "-m":
                found.append(segment[segment.index("oarctl.cli") + 1:])
            segment = []
    return found


def _placeholder(value: str) -> bool:
    """A value the reader fills in: `$seed`, `...`, `CONFIG`, `MODEL_DIR`."""
    return "$" in value or "..." in value or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.\w+)?", Path(value).name))


def check_command_line(arguments: list[str]) -> str | None:
    """None when the real CLI parses `oarctl ARGUMENTS` and the config loader accepts its -c and --set;
    else what is wrong."""
    import docs_reference

    from oarctl.config import load_config
    from oarctl.errors import OarError
    from oarctl.schema import SECTIONS, section_class

    command, name, rest = docs_reference.cli_root(), "oarctl", list(arguments)
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        command, name, rest = command.commands[rest[0]], f"{name} {rest[0]}", rest[1:]
    if hasattr(command, "commands"):
        return f"no such command: oarctl {' '.join(arguments[:1])}"
    try:
        context = command.make_context(name, rest)
    except Exception as error:  # the CLI's own parse error: unknown option, bad type, missing argument
        return f"{name}: {error}"
    overrides = []
    for override in context.params.get("set") or []:
        key, _, value = override.partition("=")
        section, _, option = key.partition(".")
        if section not in SECTIONS or option not in {f for f in section_class(section).__dataclass_fields__}:
            return f"{name}: --set {key}: no such option"
        if not _placeholder(value):
            overrides.append(override)
    if context.params.get("method") and not _placeholder(context.params["method"]):
        overrides.append(f"attribute.method={context.params['method']}")
    config = context.params.get("config")
    if config is not None and _placeholder(str(config)):
        config = None
    if config is not None and not (ROOT / config).is_file():
        return f"{name}: -c {config}: no such file in the repository"
    try:
        load_config(ROOT / config if config is not None else None, overrides)
    except OarError as error:
        return f"{name}: {error}"
    return None


def test_every_oarctl_command_line_of_every_shell_snippet_parses():
    problems = []
    for found in page_snippets().values():
        for snippet in found:
            if snippet.language != "bash":
                continue
            for arguments in oarctl_command_lines(snippet.code):
                problem = check_command_line(arguments)
                if problem:
                    problems.append(f"{snippet.page}:{snippet.line}: {problem}")
    assert problems == []


# ---- the rules themselves, on small pages ----------------------------------------------------------------

def test_the_reader_finds_languages_markers_and_lines():
    page = ("intro\n```bash\n# gpu: 8 GPUs\naccelerate launch x\n```\n```python\nprint(1)\n```\n"
            "```\nan output\n```\n```yaml\na: 1\n```\n```sh\necho hi\n```\n")
    found = snippets(page)
    assert [(s.line, s.language, s.marker, s.runs) for s in found] == [
        (2, "bash", "gpu", False), (6, "python", None, True), (15, "bash", None, True)]


def test_a_failing_snippet_fails_its_page_and_names_the_line(tmp_path):
    page = "```bash\necho made > made.txt\n```\n\n```python\nprint(open('made.txt').read())\nx = model\n```\n"
    with pytest.raises(AssertionError, match=r"(?s)page:5: the python snippet exited 1:.*NameError"):
        run_page(snippets(page), tmp_path)
    with pytest.raises(AssertionError, match="page:1: the bash snippet"):
        run_page(snippets("```bash\nfalse\necho not reached\n```\n"), tmp_path)


def test_command_lines_are_found_and_a_renamed_option_or_config_key_is_caught():
    code = ("oarctl show a.parquet --rows 3 && PYTHONPATH=. oarctl toy prompts -o p.parquet -n 4  # two\n"
            "accelerate launch --config_file f.yaml -m oarctl.cli update adv.parquet -o policy \\\n"
            "  --step 1 -c CONFIG\n")
    assert oarctl_command_lines(code) == [["show", "a.parquet", "--rows", "3"],
                                          ["toy", "prompts", "-o", "p.parquet", "-n", "4"],
                                          ["update", "adv.parquet", "-o", "policy", "--step", "1", "-c", "CONFIG"]]
    assert [check_command_line(a) for a in oarctl_command_lines(code)] == [None, None, None]
    assert "--row-count" in check_command_line(["show", "a.parquet", "--row-count", "3"])
    assert "no such command" in check_command_line(["sampel", "p.parquet"])
    assert "sample.temprature" in check_command_line(["sample", "p.parquet", "-o", "r.parquet",
                                                      "--set", "sample.temprature=0.7"])
    assert "nope" in check_command_line(["attribute", "v.parquet", "-o", "a.parquet", "--method", "nope"])
    assert check_command_line(["run", "-c", "configs/quick.yaml", "--set", "attribute.method=..."]) is None
