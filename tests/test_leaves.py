"""The house rules of oarctl/, read from the code's own imports (every import, also those inside
functions): layered floors with a table of which floor may import which, no import circle, stages as
leaves both ways, module state only where processes and the hash memo live (and a short table of named
caches), one answer to "which
rank am I". Each rule is also run on a small handmade package that breaks it, so a rule that could
never fail would show.

Floors, low to high (a module imports its own floor or lower, never higher):
    ground        errors, registry, artifacts, schema, hashing: import nothing of oarctl but ground
    library       everything not named elsewhere (verify, attribution, policy, training, config, ...)
    stages        oarctl.stages.*: imported only by the pipeline; import no orchestration
    orchestration pipeline, loop, processes.launch, processes.update_worker
    entry         cli, integrations.*: what users call
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "oarctl"

GROUND = {"", "errors", "registry", "artifacts", "schema", "hashing"}  # "": oarctl/__init__.py, a version string
ORCHESTRATION = {"pipeline", "loop", "processes.launch", "processes.update_worker"}
ENTRY = {"cli", "integrations"}
FLOORS = ["ground", "library", "stages", "orchestration", "entry"]
# Who may import a stage, and which orchestration a stage may still import (none).
STAGE_IMPORTERS = {"pipeline"}
# Module-level state that functions change: only the process hand-off and the hash memo keep any.
STATEFUL = ("processes", "hashing")
# Process-lifetime caches that stay beside the code they serve (each named, with why); any other
# module state a function changes fails the rule.
CACHES = {
    ("policy.vllm_backend", "_engine"): "the one vLLM engine this process serves, kept across steps",
    ("policy.vllm_backend", "_load_report"): "how that engine's weights were last loaded (read by the stage)",
    ("policy.vllm_replicas", "_running"): "the data-parallel engine replicas this process started",
    ("policy.canary", "_references"): "the canary reference of each checkpoint, read once",
    ("verify.equivalence", "_POOLS"): "the sympy worker pool per timeout (bounded symbolic work)",
    ("verify.equivalence", "_MEMO"): "verdicts of answer pairs already decided",
}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add",
            "discard", "remove", "__setitem__"}
RANK_ANSWER = "distributed"  # the one module that reads RANK / WORLD_SIZE


# ---- reading the imports ------------------------------------------------------------------------

def module_name(path: Path, package: Path) -> str:
    """oarctl/stages/update.py -> "stages.update"; a package's __init__ is the package itself."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, module: str, is_package: bool, root: str) -> list[str]:
    """Names (relative to the package `root`) an import statement brings in: `from x import y` gives x
    and x.y, so a submodule imported by name is seen."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            package = ([root] + module.split(".")) if module else [root]
            package = package if is_package else package[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    else:
        return []
    local = ["" if n == root else n[len(root) + 1:] for n in names if n == root or n.startswith(root + ".")]
    return local


def modules(package: Path) -> dict[str, ast.Module]:
    return {module_name(path, package): ast.parse(path.read_text(), str(path))
            for path in sorted(package.rglob("*.py"))}


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (names resolved to the nearest real module)."""
    trees = modules(package)

    def real(name: str) -> str | None:
        while name not in trees and "." in name:
            name = name.rpartition(".")[0]
        return name if name in trees else None

    def targets(node: ast.AST, name: str, is_package: bool) -> list[str]:
        names = imported(node, name, is_package, package.name)
        # `from pkg import module`: the arrow goes to the module, as for `from pkg.module import x`
        # (both run pkg/__init__ first; counting it for one form only would invent circles)
        submodules = [n for n in names[1:] if n in trees]
        return submodules if isinstance(node, ast.ImportFrom) and len(submodules) == len(names) - 1 else names

    graph = {}
    for name, tree in trees.items():
        is_package = (package / name.replace(".", "/") / "__init__.py").exists() or name == ""
        found = {real(n) for node in ast.walk(tree) for n in targets(node, name, is_package)}
        graph[name] = {n for n in found if n is not None and n != name}
    return graph


# ---- the rules ----------------------------------------------------------------------------------

def floor(module: str) -> str:
    top = module.split(".")[0]
    if module in GROUND:
        return "ground"
    if top == "stages":
        return "stages"
    if module in ORCHESTRATION:
        return "orchestration"
    if top in ENTRY:
        return "entry"
    return "library"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan). A package's __init__ that imports
    its own submodules to fill a registry is a circle when a submodule imports the __init__ back."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go to a higher floor, and imports of a stage by anything but the pipeline."""
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = FLOORS.index(floor(module)), FLOORS.index(floor(target))
            if theirs > mine:
                problems.append(f"{module} ({floor(module)}) imports {target} ({floor(target)})")
            elif floor(target) == "stages" and module not in STAGE_IMPORTERS and target != "stages":
                problems.append(f"{module} imports the stage {target}: only the pipeline imports stages")
    return problems


def _module_level_mutables(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict", "Counter"))
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if mutable:
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def changed_globals(package: Path) -> list[str]:
    """Module state a function changes (a `global` statement, or a module-level dict/list/set that a
    function assigns into or calls a mutating method on), outside processes/, hashing and CACHES."""
    problems = []
    for module, tree in modules(package).items():
        if module.startswith(STATEFUL):
            continue
        mutables = {name for name in _module_level_mutables(tree) if (module, name) not in CACHES}
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.Global):
                    problems.append(f"{module}.{function.name}: global {', '.join(node.names)}")
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                                and target.value.id in mutables:
                            problems.append(f"{module}.{function.name}: changes {target.value.id}[...]")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name) \
                        and node.func.value.id in mutables:
                    problems.append(f"{module}.{function.name}: {node.func.value.id}.{node.func.attr}(...)")
    return problems


def rank_answers(package: Path) -> list[str]:
    """Places outside `distributed` that answer "which rank am I" themselves: the launcher's RANK /
    WORLD_SIZE read from the environment, or an Accelerator's process_index / is_main_process."""
    problems = []
    for module, tree in modules(package).items():
        if module == RANK_ANSWER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("process_index", "is_main_process"):
                problems.append(f"{module}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in ("RANK", "WORLD_SIZE") \
                    and _reads_environment(tree, node):
                problems.append(f"{module}:{node.lineno} reads {node.value} from the environment")
    return problems


def _reads_environment(tree: ast.Module, constant: ast.Constant) -> bool:
    """The constant is the key of os.environ.get(...) or os.environ[...] (a read, not a launcher
    setting the variable for a child)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and "environ" in ast.unparse(node.func.value) and node.args and node.args[0] is constant:
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and "environ" in ast.unparse(node.value) and node.slice is constant:
            return True
    return False


# ---- on oarctl ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGE)


def test_no_import_circle(graph):
    assert circles(graph) == [], "import circles (every import counted, also inside functions)"


def test_every_import_goes_down_the_floors(graph):
    assert upward(graph) == []


def test_stages_import_no_orchestration_and_of_processes_only_gpus(graph):
    for module, targets in graph.items():
        if floor(module) == "stages":
            assert not {t for t in targets if t.startswith("processes.") and t != "processes.gpus"}, module
            assert not {t for t in targets if floor(t) in ("orchestration", "entry")}, module


def test_only_processes_and_the_hash_memo_keep_module_state():
    assert changed_globals(PACKAGE) == []


def test_one_answer_to_which_rank_am_i():
    assert rank_answers(PACKAGE) == []


def test_the_check_sees_the_pipeline_import_of_stages(graph):
    assert "stages.attribute" in graph["pipeline"]


# ---- each rule fails on a package that breaks it --------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "oarctl"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root


def test_a_forbidden_import_inside_a_function_is_flagged(tmp_path):
    package = _package(tmp_path, {
        "schema.py": "def f():\n    from oarctl.pipeline import STAGES\n",
        "pipeline.py": "from oarctl.stages import sample\n",
        "stages/sample.py": "from . import verify\nfrom ..loop import run_loop\n",
        "stages/verify.py": "",
        "loop.py": "import oarctl.schema\nfrom oarctl.stages import sample\n",
        "policy/paths.py": "from oarctl.stages.sample import x\n"})
    assert upward(import_graph(package)) == [
        "loop imports the stage stages.sample: only the pipeline imports stages",
        "policy.paths (library) imports stages.sample (stages)",
        "schema (ground) imports pipeline (orchestration)",
        "stages.sample (stages) imports loop (orchestration)",
        "stages.sample imports the stage stages.verify: only the pipeline imports stages"]


def test_a_circle_through_a_function_level_import_is_flagged(tmp_path):
    package = _package(tmp_path, {"config.py": "def validate():\n    from oarctl.attribution import METHODS\n",
                                  "attribution/__init__.py": "from oarctl.attribution import flow\nMETHODS = 1\n",
                                  "attribution/flow.py": "from oarctl.config import validate\n"})
    assert circles(import_graph(package)) == [["attribution", "attribution.flow", "config"]]


def test_changed_module_state_is_flagged_outside_processes(tmp_path):
    package = _package(tmp_path, {
        "pipeline.py": "_SHARED = {}\nLIMIT = 3\ndef f():\n    _SHARED['x'] = 1\n",
        "policy/engine.py": "_ENGINES = []\ndef f():\n    _ENGINES.append(1)\n",
        "loop.py": "_STATE = None\ndef f():\n    global _STATE\n    _STATE = 1\n",
        "processes/gpus.py": "_HELD = {}\ndef f():\n    _HELD['x'] = 1\n"})
    assert sorted(changed_globals(package)) == ["loop.f: global _STATE", "pipeline.f: changes _SHARED[...]",
                                                "policy.engine.f: _ENGINES.append(...)"]


def test_a_second_answer_to_which_rank_is_flagged(tmp_path):
    package = _package(tmp_path, {
        "runner.py": "import os\ndef main():\n    return int(os.environ.get('RANK', '0')) == 0\n",
        "training/setup.py": "def f(accelerator):\n    return accelerator.process_index\n",
        "processes/launch.py": "import os\ndef child(env):\n    env['RANK'] = '1'\n",
        "distributed.py": "import os\ndef rank():\n    return int(os.environ.get('RANK', '0'))\n"})
    assert rank_answers(package) == ["runner:3 reads RANK from the environment", "training.setup:2 .process_index"]


def test_the_modules_page_lists_every_module_once():
    """The generated modules page (docs/reference/modules.md) has one row per module, so a newcomer finds
    every file there (tests/test_docs_site.py keeps the committed page equal to the code)."""
    page = (PACKAGE.parent / "docs" / "reference" / "modules.md").read_text()
    rows = [line.split("|")[1].strip().strip("`") for line in page.splitlines() if line.startswith("| `oarctl/")]
    files = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py"))
    assert sorted(set(files) - set(rows)) == [] and len(rows) == len(set(rows))
