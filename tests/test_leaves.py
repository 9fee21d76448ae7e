"""Stages are leaves: only oarctl/pipeline.py (the table of contents) imports oarctl.stages, so no library
module depends on a stage and there are no import cycles through them; stages do not import each other."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "oarctl"
ALLOWED = {"oarctl.pipeline"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Absolute names an import statement brings in (`from x import y` gives x and x.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _stage_imports() -> dict[str, list[str]]:
    """module -> the oarctl.stages names it imports, anywhere in its body (function-level imports too)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        names = [name for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 for name in _imported(node, module, path.name == "__init__.py")]
        stages = sorted({n for n in names if n == "oarctl.stages" or n.startswith("oarctl.stages.")})
        if stages:
            found[module] = stages
    return found


def test_only_the_pipeline_imports_stages():
    offenders = {module: names for module, names in _stage_imports().items() if module not in ALLOWED}
    assert offenders == {}, f"these modules import stages (move the shared code into a library module): {offenders}"


def test_the_check_sees_the_pipeline_import():
    """The parser finds real imports: the pipeline's `from oarctl.stages import attribute, ...`."""
    assert "oarctl.stages.attribute" in _stage_imports()["oarctl.pipeline"]


def test_relative_imports_are_resolved():
    tree = ast.parse("from .update import run\nfrom . import sample\n")
    names = [n for node in tree.body for n in _imported(node, "oarctl.stages.attribute", False)]
    assert "oarctl.stages.update" in names and "oarctl.stages.sample" in names
