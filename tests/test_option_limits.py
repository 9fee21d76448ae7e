"""Every CLI option with a bad value is one `error:` line naming it, exit code 2, and nothing written.

The commands and options come from the Typer app itself, so a command or option added later is
walked too: one missing from the table of oarctl/options.py fails here until it is listed."""
from __future__ import annotations

import pytest
import typer

from oarctl.cli import app
from oarctl.options import OPTIONS, Choice, Existing, Folder, Free, Number, Override


def _commands(group, prefix=()):
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):  # a sub-app (`toy`); Typer vendors its own click
            yield from _commands(command, prefix + (name,))
        else:
            yield prefix + (name,), command


COMMANDS = list(_commands(typer.main.get_command(app)))
WALKED = [(path, option) for path, command in COMMANDS for option in command.params
          if option.param_type_name == "option" and not option.is_flag and option.name != "help"]


def _bad_values(rule, tmp_path) -> list[str]:
    if isinstance(rule, Number):
        below = rule.minimum if rule.above else rule.minimum - 1
        return [str(below)] + ([str(rule.maximum + 1)] if rule.maximum is not None else [])
    if isinstance(rule, Choice):
        return ["no-such-name"] + (["uniform,,"] if rule.listed else [])
    if isinstance(rule, Existing):
        return [str(tmp_path / "absent"), str(tmp_path / ("a_file" if rule.kind == "folder" else ""))]
    if isinstance(rule, Folder):
        return [str(tmp_path / "a_file")]
    if isinstance(rule, Override):
        return ["no_equals_sign", "sample.no_such_key=1", "sample.group_size=many"]
    return []


def test_every_option_is_in_the_table():
    missing = sorted({f"{' '.join(path)} {option.opts[-1]} ({option.name})" for path, option in WALKED
                      if option.name not in OPTIONS})
    assert not missing, f"list these options in oarctl/options.py OPTIONS: {missing}"
    assert all(rule.why for rule in OPTIONS.values() if isinstance(rule, Free))


def test_the_walk_sees_the_options_of_the_issue():
    walked = {(" ".join(path), option.name) for path, option in WALKED}
    assert {("sample", "step"), ("toy prompts", "count"), ("show", "rows"), ("run", "steps")} <= walked


CHECKED = [(path, option) for path, option in WALKED if not isinstance(OPTIONS.get(option.name), Free)]


@pytest.mark.parametrize("path, option", CHECKED, ids=[f"{' '.join(p)}-{o.name}" for p, o in CHECKED])
def test_a_bad_value_is_one_error_line_and_nothing_written(cli, tmp_path, path, option):
    rule = OPTIONS.get(option.name)
    assert rule is not None, f"list {option.opts[-1]} ({option.name}) in oarctl/options.py OPTIONS"
    values = _bad_values(rule, tmp_path)
    command = dict(COMMANDS)[path]
    (tmp_path / "a_file").write_text("a file where a folder is expected\n")
    work = tmp_path / "work"
    work.mkdir()
    # every argument and required option gets a path in `work` (nothing is read before the check)
    base = [str(work / f"{p.name}.parquet") for p in command.params if p.param_type_name == "argument"]
    base += [x for p in command.params if p.param_type_name == "option" and p.required and p is not option
             for x in (p.opts[-1], str(work / f"{p.name}.out"))]
    for value in values:
        result = cli(*path, *base, option.opts[-1], value)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2, (value, result.output)
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert any(spelling in lines[0] for spelling in option.opts), lines[0]
        assert not list(work.iterdir()), list(work.iterdir())
