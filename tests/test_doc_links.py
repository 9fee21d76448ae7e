"""No file of the repository points to a page that is not in it.

Every repository-relative path named in a source file or page (`docs/method.md`, `oarctl/reshaping.py`,
`configs/qwen2.5-*/*.yaml`) must exist in the checkout, and every relative markdown link must resolve
from its page's folder; a markdown page outside the repository (`../x/y.md` from a source file, or from a
page when it leaves the repository) is refused, since a user's clone does not have it. Names in capitals and format fields are placeholders
(`configs/CONFIG.yaml`, `configs/{name}.yaml`); `{a,b}` lists alternatives, each of which must exist.
Reads only the repository, never ../shared.
"""
from __future__ import annotations

import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("docs", "oarctl", "bench", "tests", "configs", "scripts", "examples")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".json"}
REPOSITORY_PATH = re.compile(r"(?<![\w./\\-])((?:%s)/[\w./*{},+-]*[\w*}])" % "|".join(TOP_FOLDERS))
OUTSIDE_PAGE = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*\.md)\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# a name in capitals the reader fills in (configs/CONFIG.yaml), or a format field (configs/{name}.yaml)
PLACEHOLDER = re.compile(r"(?:^|/)[A-Z][A-Z0-9_]*(?:\.|/|$)|\{[^,}]*(?:\}|$)")
SELF = Path(__file__).resolve()  # names missing paths on purpose, to show they are found


def _text_files(root: Path) -> list[Path]:
    files = [root / name for name in TOP_FILES if (root / name).is_file()]
    for folder in TOP_FOLDERS:
        files += [p for p in (root / folder).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()
                  and not any(part.startswith((".", "__pycache__")) for part in p.relative_to(root).parts)]
    return files


def _expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [expanded for choice in match.group(1).split(",")
            for expanded in _expand_braces(pattern[:match.start()] + choice + pattern[match.end():])]


def _exists(root: Path, reference: str) -> bool:
    reference = reference.rstrip(".,")
    return all(glob.glob(str(root / pattern)) for pattern in _expand_braces(reference))


def _inside(root: Path, page: Path, reference: str) -> bool:
    """A page's `../x.md` that stays inside the repository (docs/reference/cli.md -> docs/x.md); a source
    file's is refused, since it is read from wherever the program runs."""
    return page.suffix == ".md" and (page.parent / reference).resolve().is_relative_to(root.resolve())


def broken_references(root: Path) -> list[str]:
    """'file: reference' for each path a file names that the repository at `root` does not hold."""
    broken = []
    for path in _text_files(root):
        if path.resolve() == SELF:
            continue
        text = path.read_text(errors="replace")
        where = path.relative_to(root)
        named = [r for r in REPOSITORY_PATH.findall(text) if not PLACEHOLDER.search(r) and not _exists(root, r)]
        broken += [f"{where}: {r}" for r in named]
        broken += [f"{where}: {r} (a page outside the repository)" for r in OUTSIDE_PAGE.findall(text)
                   if not _inside(root, path, r)]
        if path.suffix == ".md":
            links = [t for t in MARKDOWN_LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]
            broken += [f"{where}: link {t}" for t in links if not (path.parent / t).exists()]
    return broken


def test_every_referenced_path_is_in_the_repository():
    assert broken_references(ROOT) == []


def test_a_missing_page_an_outside_page_and_a_dead_link_are_each_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("see [there](there.md) and [here](here.md#top)\n")
    (tmp_path / "docs" / "sub").mkdir()
    (tmp_path / "docs" / "sub" / "page.md").write_text("up: [here](../here.md); out: ../../../away.md\n")
    (tmp_path / "oarctl").mkdir()
    (tmp_path / "oarctl" / "module.py").write_text(
        '"""Section 2 of docs/here.md and docs/gone.md; configs/{a,b}.yaml; -c configs/CONFIG.yaml."""\n'
        'PATH = f"configs/{name}.yaml"\n'
        "# the method: ../shared/docs/method.md\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("run: {}\n")
    assert sorted(broken_references(tmp_path)) == [
        "docs/here.md: link there.md",
        "docs/sub/page.md: ../../../away.md (a page outside the repository)",
        "oarctl/module.py: ../shared/docs/method.md (a page outside the repository)",
        "oarctl/module.py: configs/{a,b}.yaml",
        "oarctl/module.py: docs/gone.md",
    ]
