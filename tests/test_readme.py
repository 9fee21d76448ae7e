"""The README is a front door that cannot go stale: at most 250 lines, and every figure in its credit
table equal to the file a command wrote (`python bench/credit_gate.py` -> docs/results/credit-gate-local.md and credit-gate-baselines.md,
`python scripts/ceiling.py` -> docs/results/credit-ceiling.md and credit-local-ceiling.md, `oarctl gradient-check`
-> docs/results/gradient-check-base.md and gradient-check-trained.md). A row whose
figure is "—" claims nothing. Reads only the repository.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results"
# README column -> (files that hold the figure, their column); a row's method names the file's row
SOURCES = {
    "AUC": (["credit-gate-local.md", "credit-gate-baselines.md"], "AUC"),
    "attribute s": (["credit-gate-local.md"], "attribute s"),
    "vs GRPO": (["credit-ceiling.md", "credit-local-ceiling.md"], "- uniform (95% CI)"),
    "gradient, base": (["gradient-check-base.md"], "vs uniform [95% CI]"),
    "gradient, trained": (["gradient-check-trained.md"], "vs uniform [95% CI]"),
}
NOT_CLAIMED = "—"


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every pipe table of a markdown text, as rows of header -> cell (method names without backticks)."""
    tables, lines = [], text.splitlines()
    for number, line in enumerate(lines[:-1]):
        first = number == 0 or not lines[number - 1].startswith("|")
        if first and line.startswith("|") and lines[number + 1].startswith("|---"):
            header = [cell.strip() for cell in line.strip("|").split("|")]
            rows = []
            for row in lines[number + 2:]:
                if not row.startswith("|"):
                    break
                cells = [cell.strip().strip("`") for cell in row.strip("|").split("|")]
                rows.append(dict(zip(header, cells)))
            tables.append(rows)
    return tables


def _credit_table() -> list[dict[str, str]]:
    text = README.read_text()
    section = text[text.index("## Which credit method?"):]
    return markdown_tables(section)[0]


def figure(files: list[str], column: str, method: str) -> str | None:
    for name in files:
        for table in markdown_tables((RESULTS / name).read_text()):
            for row in table:
                if row.get("method") == method and column in row:
                    return row[column]
    return None


def stale_figures(rows: list[dict[str, str]]) -> list[str]:
    """'method, column: README x, file y' for each figure that differs from its file."""
    problems = []
    for row in rows:
        for column, (files, source_column) in SOURCES.items():
            shown = row.get(column, NOT_CLAIMED)
            if shown == NOT_CLAIMED:
                continue
            written = figure(files, source_column, row["method"])
            if shown != written:
                problems.append(f"{row['method']}, {column}: README {shown}, {' / '.join(files)} {written}")
    return problems


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_the_credit_table_figures_equal_the_files_commands_wrote():
    rows = _credit_table()
    assert {"uniform", "oar_flow_local"} <= {row["method"] for row in rows}
    assert stale_figures(rows) == []


def test_a_figure_typed_by_hand_is_caught():
    rows = [{"method": "oar_flow_local", "AUC": "0.83", "attribute s": "4.8", "vs GRPO": NOT_CLAIMED},
            {"method": "nonexistent", "AUC": "0.9", "attribute s": NOT_CLAIMED, "vs GRPO": NOT_CLAIMED}]
    gate = "credit-gate-local.md / credit-gate-baselines.md"
    assert stale_figures(rows) == [f"oar_flow_local, AUC: README 0.83, {gate} 0.825",
                                   f"nonexistent, AUC: README 0.9, {gate} None"]
