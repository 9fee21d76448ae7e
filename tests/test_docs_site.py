"""The documentation site: built with --strict (a broken link or a missing page fails), its reference pages
generated from the code and committed current, and nothing the reference shows left without help.

Builds the site in-process into a temporary folder (mkdocs and mkdocs-material come with the dev extra), so
the generator's imports (the CLI, the schema, the registries) are paid once. Reads only the repository.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import docs_reference  # noqa: E402  (scripts/docs_reference.py: the generator and the mkdocs hook)


def test_every_command_option_and_argument_has_help():
    assert docs_reference.undocumented_cli() == []


def test_every_config_option_has_help():
    assert docs_reference.undocumented_config() == []


def test_every_artifact_column_is_described_in_artifacts_py():
    assert docs_reference.undocumented_columns() == []


def test_every_registry_entry_says_what_it_does():
    assert docs_reference.undocumented_registry_entries() == []


def test_the_reference_lists_every_command_option_and_column():
    pages = docs_reference.generated_pages()
    for full, command in docs_reference.cli_commands():
        assert f"## `{full}`" in pages["reference/cli.md"]
        for param in command.params:
            if param.param_type_name == "option":
                assert all(f"`{name}`" in pages["reference/cli.md"] for name in param.opts)
    assert all(f"`{section}.{f.name}` | " in pages["reference/config.md"]
               for section, f, _ in docs_reference.config_options())
    assert all(f"| `{field.name}` |" in pages["reference/artifacts.md"]
               for _, field, _ in docs_reference.artifact_columns())
    assert "| `oar_flow_local` |" in pages["reference/registries.md"]


def test_the_committed_reference_pages_are_current():
    stale = docs_reference.stale_pages()
    assert stale == [], f"docs/{stale[0]} differs from the code: run `make docs-ref` and commit docs/reference/"


def _build(config_file: Path, site: Path, monkeypatch) -> None:
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # mkdocs-material's end-of-life notice, not a page problem
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(config_file), site_dir=str(site), strict=True))


def test_the_site_builds_strictly(tmp_path, monkeypatch):
    _build(ROOT / "mkdocs.yml", tmp_path / "site", monkeypatch)
    for page in ("index.html", "reference/cli.html", "reference/config.html", "reference/artifacts.html",
                 "method.html", "results.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "oarctl sample" in (tmp_path / "site" / "reference" / "cli.html").read_text()


def test_a_dead_link_or_a_page_missing_from_the_nav_fails_the_build(tmp_path, monkeypatch):
    from mkdocs.exceptions import Abort

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\nstrict: true\nnav:\n  - Home: index.md\n")
    with pytest.raises(Abort):
        _build(config, tmp_path / "site", monkeypatch)
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n")
    config.write_text("site_name: t\nstrict: true\nnav:\n  - Home: index.md\n  - Guide: gone.md\n")
    with pytest.raises(Abort):
        _build(config, tmp_path / "site", monkeypatch)
    config.write_text("site_name: t\nstrict: true\nnav:\n  - Home: index.md\n  - Guide: guide.md\n")
    _build(config, tmp_path / "site", monkeypatch)


def test_every_module_says_what_it_is_for():
    assert docs_reference.undocumented_modules() == []
