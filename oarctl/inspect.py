"""`oarctl show`: a quick look at any artifact, manifest or metrics file."""
from __future__ import annotations

import json
from pathlib import Path

from oarctl.errors import OarError


def _preview(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def show_file(path: Path, rows: int = 5) -> str:
    if path.is_dir() and (path / "update.parquet").exists():
        path = path / "update.parquet"  # a policy folder: show its update log
    if path.suffix in (".json", ".jsonl", ".yaml"):
        if not path.is_file():
            raise OarError(f"{path}: file not found")
        return path.read_text()
    from oarctl.artifacts import _open_parquet

    table = _open_parquet(path)
    lines = [f"{path}: {table.num_rows} rows, {table.num_columns} columns", "schema:"]
    lines += [f"  {field.name}: {field.type}" for field in table.schema]
    for index, row in enumerate(table.slice(0, rows).to_pylist()):
        lines.append(f"row {index}:")
        lines += [f"  {key}: {_preview(value)}" for key, value in row.items()]
    return "\n".join(lines)
