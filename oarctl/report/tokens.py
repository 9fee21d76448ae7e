"""Rows of attributions / advantages artifacts as (tokens, values, answer span), for heatmaps.

Artifacts store token ids, not a tokenizer, so tokens are decoded one id at a time with the
policy's tokenizer (a multi-byte character split across tokens shows as a replacement mark).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from oarctl.errors import OarError

# --by choice -> the per-token column it colours by
VALUE_COLUMNS = {"weight": "token_weights", "score": "token_scores", "advantage": "token_advantages"}


@dataclass
class TokenRow:
    tokens: list[str]
    values: list[float]
    span: tuple[int, int] | None  # answer tokens, half-open; None when the row has no answer
    header: str


def default_by(column_names) -> str:
    """Weights for advantages files (what the update optimises), raw scores for attributions."""
    return "weight" if "token_weights" in column_names else "score"


def run_policy(*folders: Path) -> Path:
    """policy.path of the first of `folders` holding a run's config.yaml, else the schema's default policy; a
    malformed config.yaml is a one-line OarError naming it."""
    from oarctl.config import read_yaml_mapping
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.schema import PolicyConfig

    default = PolicyConfig().path
    for folder in folders:
        recorded = folder / "config.yaml"
        if recorded.is_file():
            policy = read_yaml_mapping(recorded, "run config").get("policy") or {}
            if not isinstance(policy, dict):
                raise OarError(f"{recorded}: section 'policy' must be a mapping of options")
            return resolve_policy_path(str(policy.get("path", default)))
    return resolve_policy_path(default)


def decode_each(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def check_token_columns(table, path: Path, by: str | None) -> str:
    """The --by choice to use; one-line errors for a file without per-token columns."""
    names = table.column_names
    if "response_token_ids" not in names or not {"token_scores", "token_weights"} & set(names):
        raise OarError(f"{path}: no per-token columns (token_scores / token_weights); "
                       f"expected an attributions or advantages file")
    by = by or default_by(names)
    if by not in VALUE_COLUMNS:
        raise OarError(f"--by: expected one of {', '.join(VALUE_COLUMNS)}, got {by!r}")
    if VALUE_COLUMNS[by] not in names:
        raise OarError(f"{path}: has no column {VALUE_COLUMNS[by]!r} for --by {by}")
    return by


def _header(row: dict, index: int, by: str) -> str:
    advantage = row.get("advantage")
    parts = [f"row {index}", f"reward {row.get('reward', float('nan')):.3g}", f"verdict {row.get('verdict', '?')}",
             f"group advantage {advantage:+.3f}" if advantage is not None else "group advantage n/a",
             f"coloured by {by}"]
    return " | ".join(parts)


def row_values(row: dict, by: str) -> list[float]:
    return [float("nan") if v is None else float(v) for v in row[VALUE_COLUMNS[by]]]


def answer_span(row: dict) -> tuple[int, int] | None:
    """The answer tokens within the response; None without one (a probe's span lies past the response)."""
    start, end = row.get("answer_start"), row.get("answer_end")
    if row.get("uses_probe") or start is None or end is None:
        return None
    end = min(end, len(row["response_token_ids"]))
    return (start, end) if 0 <= start < end else None


def token_row(row: dict, index: int, by: str, tokenizer) -> TokenRow:
    return TokenRow(decode_each(tokenizer, row["response_token_ids"]), row_values(row, by), answer_span(row),
                    _header(row, index, by))


def read_row(path: Path, index: int, by: str | None) -> tuple[dict, str]:
    """(row as a dict, --by choice), checked: token columns present, index in range."""
    from oarctl.artifacts import _open_parquet

    table = _open_parquet(path)
    by = check_token_columns(table, path, by)
    if not 0 <= index < table.num_rows:
        raise OarError(f"--row {index}: out of range, {path} has {table.num_rows} rows (0..{table.num_rows - 1})")
    return table.slice(index, 1).to_pylist()[0], by


def wants_color(flag: bool | None, stream) -> bool:
    """--color / --no-color decide; otherwise colour only a terminal, and never when NO_COLOR is set to
    anything but the empty string (https://no-color.org)."""
    if flag is not None:
        return flag
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def show_row(path: Path, index: int, by: str | None = None, policy: Path | None = None, color: bool = True) -> str:
    """`oarctl show FILE --row N`: a header line, the problem, then the coloured response."""
    from oarctl.checkpoints import load_tokenizer
    from oarctl.report.heatmap import render_ansi, render_plain

    row, by = read_row(path, index, by)
    tokenizer = load_tokenizer(policy or run_policy(path.parent, path.parent.parent))
    shown = token_row(row, index, by, tokenizer)
    body = (render_ansi if color else render_plain)(shown.tokens, shown.values, shown.span)
    return "\n".join([shown.header, f"problem: {row.get('problem', '')}", body])
