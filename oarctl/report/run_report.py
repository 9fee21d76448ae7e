"""`oarctl report RUN_DIR`: one self-contained HTML page of a run, plus its plots as PNG files.

Reads RUN_DIR/metrics.jsonl (training curves, held-out accuracy), RUN_DIR/config.yaml (the policy
whose tokenizer decodes the heatmaps) and the last finished step's advantages.parquet (token
heatmaps). The page has inline CSS, images as base64 data URIs and no script, so it can be mailed,
archived or opened offline; the same plots are written as PNGs into a folder named like the page.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from oarctl.errors import OarError

# (file name, title, metrics.jsonl key) of the step curves, in page order
STEP_CURVES = [
    ("reward", "training reward", "verify/reward_mean"),
    ("entropy", "policy entropy", "update/entropy"),
    ("response_length", "response length (tokens)", "sample/response_length_mean"),
    ("kl", "KL to the reference", "update/kl"),
    ("clip_fraction", "clip fraction", "update/clip_fraction"),
    ("top10_mass_share", "top-10% tokens' share of |advantage|", "reshape/top10_mass_share"),
    ("effective_tokens", "effective weighted tokens", "reshape/effective_tokens"),
]
HEATMAPS_PER_VERDICT = 3

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1150px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
.curves img { width: 360px; margin: 4px; border: 1px solid #eee; }
.missing { color: #a00; font-size: 13px; }
.rollout { margin: 14px 0; padding: 8px; border: 1px solid #ddd; border-radius: 4px; }
.meta { font-size: 13px; color: #555; margin-bottom: 6px; }
.tokens { font-family: monospace; font-size: 14px; line-height: 1.9; white-space: pre-wrap; word-break: break-all; }
.tok { padding: 1px 0; }
.answer { outline: 2px solid #1a7f37; outline-offset: 1px; border-radius: 2px; }
.legend span { display: inline-block; width: 28px; height: 12px; }
"""


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise OarError(f"{run_dir}: run folder not found")
    if not path.is_file():
        raise OarError(f"{path}: file not found (has `oarctl run` finished a step?)")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise OarError(f"{path}: not valid JSON lines ({error})") from None


def step_series(lines: list[dict], key: str) -> tuple[list, list]:
    points = [(x["step"], x[key]) for x in lines if x.get("kind") == "step" and isinstance(x.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def eval_series(lines: list[dict], key: str) -> tuple[list, list]:
    points = [(x["after_steps"], x[key]) for x in lines if x.get("kind") == "eval" and key in x]
    return [p[0] for p in points], [p[1] for p in points]


def sampled_key(lines: list[dict]) -> str | None:
    """The avg@k key of the eval lines (k = evaluate.samples of the run)."""
    keys = {k for x in lines if x.get("kind") == "eval" for k in x if k.startswith("eval/avg@")}
    return min(keys) if keys else None


def curves(lines: list[dict]) -> tuple[dict[str, bytes], list[str]]:
    """{file name: PNG bytes} of every curve with data, and the titles of those without."""
    from oarctl.report.plots import curve_png

    images, missing = {}, []
    accuracy = {"greedy": eval_series(lines, "eval/greedy_accuracy")}
    if sampled_key(lines):
        accuracy[f"sampled {sampled_key(lines)[5:]}"] = eval_series(lines, sampled_key(lines))
    if accuracy["greedy"][0]:
        images["heldout_accuracy"] = curve_png("held-out accuracy", accuracy, xlabel="steps trained")
    else:
        missing.append("held-out accuracy (no eval lines)")
    for name, title, key in STEP_CURVES:
        xs, ys = step_series(lines, key)
        if xs:
            images[name] = curve_png(title, {key: (xs, ys)})
        else:
            missing.append(f"{title} ({key} not in metrics.jsonl)")
    return images, missing


def last_advantages(run_dir: Path) -> Path | None:
    """The last step's advantages.parquet whose manifest says it is complete."""
    for folder in sorted(run_dir.glob("step_*"), reverse=True):
        path = folder / "advantages.parquet"
        if path.is_file() and path.with_name(path.name + ".manifest.json").is_file():
            return path
    return None


def choose_rows(rows: list[dict], per_verdict: int = HEATMAPS_PER_VERDICT) -> list[int]:
    """A few correct and a few incorrect rollouts, those of mixed-reward groups first (they carry credit)."""
    rewards: dict[str, set] = {}
    for row in rows:
        rewards.setdefault(row["prompt_id"], set()).add(row["reward"])
    order = sorted(range(len(rows)), key=lambda i: (len(rewards[rows[i]["prompt_id"]]) < 2, i))
    correct = [i for i in order if rows[i]["reward"] > 0.5][:per_verdict]
    wrong = [i for i in order if rows[i]["reward"] <= 0.5][:per_verdict]
    return correct + wrong


def heatmap_sections(path: Path, policy: Path) -> str:
    import pyarrow.parquet as pq

    from oarctl.checkpoints import load_tokenizer
    from oarctl.report.heatmap import render_html
    from oarctl.report.tokens import token_row

    rows = pq.read_table(path).to_pylist()
    tokenizer = load_tokenizer(policy)
    parts = []
    for index in choose_rows(rows):
        shown = token_row(rows[index], index, "weight", tokenizer)
        parts.append(f'<div class="rollout"><div class="meta">{html.escape(shown.header)}<br>problem: '
                     f'{html.escape(rows[index]["problem"])} &nbsp; gold: {html.escape(rows[index]["answer"])}</div>'
                     f'<div class="tokens">{render_html(shown.tokens, shown.values, shown.span)}</div></div>')
    return "\n".join(parts)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _legend() -> str:
    from oarctl.report.heatmap import colour_scale

    colour = colour_scale([0.0, 1.0])
    cells = "".join('<span style="background:#{:02x}{:02x}{:02x}"></span>'.format(*colour(i / 8)) for i in range(9))
    return (f'<p class="legend">token weight, lowest {cells} highest (per rollout); grey: no value; '
            f'<span class="answer" style="width:auto;height:auto">&nbsp;outlined&nbsp;</span> = answer tokens</p>')


def render_page(run_dir: Path, images: dict[str, bytes], missing: list[str], heatmaps: str, source: str) -> str:
    figures = "".join(f'<img src="{_data_uri(png)}" alt="{name}">' for name, png in images.items())
    absent = "".join(f'<p class="missing">not plotted: {html.escape(m)}</p>' for m in missing)
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>oarctl report: {html.escape(run_dir.name)}'
            f'</title><style>{STYLE}</style></head><body><h1>Run {html.escape(str(run_dir))}</h1>'
            f'<h2>Training curves</h2><div class="curves">{figures}</div>{absent}'
            f'<h2>Token credit ({html.escape(source)})</h2>{_legend()}{heatmaps}</body></html>')


def write_report(run_dir: Path, output: Path | None = None, log=print) -> Path:
    """Write the page and its PNGs (into OUTPUT's folder named like the page); returns the page path."""
    from oarctl.artifacts import write_bytes_atomically
    from oarctl.report.tokens import run_policy

    output = output or run_dir / "report.html"
    images, missing = curves(read_metrics(run_dir))
    advantages = last_advantages(run_dir)
    if advantages is None:
        heatmaps, source = '<p class="missing">no finished advantages.parquet in this run yet</p>', "none"
    else:
        heatmaps, source = heatmap_sections(advantages, run_policy(run_dir)), str(advantages.relative_to(run_dir))
    for name, png in images.items():
        write_bytes_atomically(output.parent / output.stem / f"{name}.png", png)
    write_bytes_atomically(output, render_page(run_dir, images, missing, heatmaps, source))
    log(f"report: {len(images)} plots, {len(missing)} missing, heatmaps from {source}")
    return output
