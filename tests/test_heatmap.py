"""Per-token heatmaps (oarctl/report/heatmap.py), `oarctl show --row`, and reshape's credit-concentration
metrics (top10_mass_share, effective_tokens)."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from oarctl.report.heatmap import (NEUTRAL_HTML, UNDERLINE, colour_scale, luminance, render_ansi, render_html,
                                   render_plain)
from oarctl.reshaping import concentration_metrics, effective_tokens, top_mass_share

NAN = float("nan")
# The embedded toy policy writes reasoning before its answer (the tiny test policy answers at once,
# leaving empty reasoning spans); entropy attribution makes the weights vary.
REASONING_RUN = dict(run={"steps": 1, "progress": False}, policy={"path": "toy"}, attribute={"method": "entropy"},
                     sample={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 40})
BACKGROUND = re.compile(r"\x1b\[48;2;(\d+);(\d+);(\d+)m")


def test_sequential_colours_darken_monotonically_with_the_value():
    values = [0.1, 0.4, 0.5, 1.0, 1.7, 2.0]
    colour = colour_scale(values)
    shades = [luminance(colour(v)) for v in values]
    assert all(a > b for a, b in zip(shades, shades[1:])), shades


def test_signed_values_diverge_around_zero_monotonically():
    values = [-2.0, -1.0, -0.1, 0.0, 0.3, 1.0]
    colour = colour_scale(values)
    redness = [colour(v)[0] - colour(v)[2] for v in values]  # red minus blue grows with the value
    assert all(a < b for a, b in zip(redness, redness[1:])), redness
    assert colour(-2.0)[2] > colour(-2.0)[0] and colour(1.0)[0] > colour(1.0)[2]


def test_plain_text_form_exact():
    tokens = ["1", "+", "\n", "\\boxed{", "2", "}"]
    values = [0.5, NAN, 1.0, 1.0, 1.5, 1.0]
    assert render_plain(tokens, values, (4, 5)) == "1[0.50]+\\n[1.00]\\boxed{[1.00]<answer>2[1.50]</answer>}[1.00]"
    assert render_plain(["a", "b"], [1.0, 2.0], None) == "a[1.00]b[2.00]"


def test_ansi_marks_only_the_answer_span_and_leaves_nan_neutral():
    tokens = ["x", "y", "=", "4", "2", "."]
    values = [NAN, 0.2, 1.0, 1.0, 1.0, 1.0]
    text = render_ansi(tokens, values, (3, 5))
    assert text.startswith("x\x1b[")  # NaN: the token alone, no style and no reset
    pieces = text[1:].split("\x1b[0m")  # one styled piece per remaining token
    for index, piece in enumerate(pieces[:5], start=1):
        assert piece.endswith(tokens[index]) and BACKGROUND.search(piece)
        assert (UNDERLINE in piece) == (index in (3, 4)), (index, piece)


def test_ansi_keeps_line_breaks():
    assert render_ansi(["a", "\n", "b"], [1.0, 1.0, 2.0]).count("\n") == 1


def test_html_spans_outline_the_answer_escape_text_and_grey_out_nan():
    page = render_html(["<", "a", "1", "2"], [NAN, 1.0, 2.0, 3.0], (2, 4))
    spans = re.findall(r'<span class="tok" style="background:(#[0-9a-f]{6});', page)
    assert len(spans) == 4 and spans[0] == NEUTRAL_HTML and len(set(spans)) == 4
    assert "&lt;" in page and "<</span>" not in page
    inside = re.search(r'<span class="answer">(.*?</span>.*?</span>)</span>', page).group(1)
    assert ">1</span>" in inside and ">2</span>" in inside and ">a</span>" not in inside


# ---- reshape metrics ---------------------------------------------------------------------------

def test_top_mass_share_by_hand():
    assert top_mass_share(np.ones(10)) == pytest.approx(0.1)
    assert top_mass_share(np.array([9.0] + [1.0] * 9)) == pytest.approx(9 / 18)
    assert top_mass_share(np.array([1.0, 3.0])) == pytest.approx(0.75)  # at least one token


def test_effective_tokens_by_hand():
    assert effective_tokens(np.ones(7)) == pytest.approx(7)
    assert effective_tokens(np.array([5.0, 0.0, 0.0, 0.0])) == pytest.approx(1)
    assert effective_tokens(np.array([1.0, 2.0])) == pytest.approx(9 / 5)


def test_concentration_metrics_skip_zero_advantage_and_empty_spans():
    weights = [np.ones(10), np.array([9.0] + [1.0] * 9), np.array([], dtype=np.float32)]
    metrics = concentration_metrics(weights, np.array([0.0, 1.0, -1.0]))
    assert metrics["top10_mass_share"] == pytest.approx(0.5)  # only the second: the first has advantage 0
    assert metrics["effective_tokens"] == pytest.approx((10 + 18 ** 2 / 90) / 2)
    assert metrics["effective_token_fraction"] == pytest.approx((1 + 18 ** 2 / 90 / 10) / 2)
    assert concentration_metrics(weights[:1], np.array([0.0])).keys() == {"effective_tokens",
                                                                         "effective_token_fraction"}


# ---- the CLI on a real run ---------------------------------------------------------------------

def _on_a_terminal(*args, **environment) -> str:
    """What `oarctl ARGS` writes to a pseudo-terminal (a subprocess: stdout really is a tty)."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    subprocess.run([sys.executable, "-m", "oarctl.cli", *map(str, args)], stdout=follower, stderr=subprocess.DEVNULL,
                   env={**os.environ, **environment}, timeout=120, check=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the terminal's other end is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks).decode()


def test_colour_follows_the_flag_then_the_terminal_then_no_color(monkeypatch):
    from oarctl.report.tokens import wants_color

    class Stream:
        def __init__(self, terminal):
            self.isatty = lambda: terminal

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert wants_color(None, Stream(True)) and not wants_color(None, Stream(False))
    assert wants_color(True, Stream(False)) and not wants_color(False, Stream(True))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color(None, Stream(True)) and wants_color(True, Stream(True))
    monkeypatch.setenv("NO_COLOR", "")  # empty means unset (no-color.org)
    assert wants_color(None, Stream(True))


def test_show_row_on_a_real_run(cli, tiny_config, tmp_path):
    import pyarrow.parquet as pq

    run_dir = tmp_path / "R"
    config = tiny_config(**REASONING_RUN)
    assert cli("run", "-c", config, "--run-dir", run_dir).exit_code == 0
    advantages, attributions = run_dir / "step_0000" / "advantages.parquet", run_dir / "step_0000" / "attributions.parquet"
    row = pq.read_table(advantages).slice(1, 1).to_pylist()[0]

    result = cli("show", advantages, "--row", 1, "--no-color")
    assert result.exit_code == 0, result.output
    header, problem, body = result.stdout.rstrip("\n").split("\n")
    assert header.startswith("row 1 | reward ") and f"verdict {row['verdict']}" in header
    assert f"group advantage {row['advantage']:+.3f}" in header and "coloured by weight" in header
    assert problem == f"problem: {row['problem']}"
    assert [float(v) for v in re.findall(r"\[(\d+\.\d+)\]", body)] == pytest.approx(row["token_weights"], abs=0.005)
    if row["answer_end"] > row["answer_start"] and not row["uses_probe"]:
        assert body.count("<answer>") == 1 and body.count("</answer>") == 1

    scores = cli("show", attributions, "--row", 1, "--no-color")
    assert scores.exit_code == 0 and "coloured by score" in scores.stdout
    coloured = cli("show", advantages, "--row", 0, "--by", "advantage", "--color")  # forced, e.g. for `| less -R`
    assert coloured.exit_code == 0 and "\x1b[48;2;" in coloured.stdout
    piped = cli("show", advantages, "--row", 0)  # CliRunner's stdout is no terminal
    assert piped.exit_code == 0 and "\x1b[" not in piped.stdout and re.search(r"\[\d+\.\d+\]", piped.stdout)
    assert "\x1b[48;2;" in _on_a_terminal("show", advantages, "--row", 0)
    assert "\x1b[" not in _on_a_terminal("show", advantages, "--row", 0, NO_COLOR="1")

    manifest = json.loads((advantages.parent / "advantages.parquet.manifest.json").read_text())
    assert {"top10_mass_share", "effective_tokens", "effective_token_fraction"} <= set(manifest["metrics"])
    assert 0 < manifest["metrics"]["effective_token_fraction"] <= 1 + 1e-6

    for args, words in [((advantages, "--row", 8), ["--row 8", "out of range", "8 rows"]),
                        ((run_dir / "step_0000" / "rollouts.parquet", "--row", 0), ["rollouts.parquet", "per-token"]),
                        ((attributions, "--row", 0, "--by", "weight"), ["token_weights"]),
                        ((advantages, "--row", 0, "--by", "heat"), ["--by"])]:
        failed = cli("show", *args)
        assert failed.exit_code == 2 and len(failed.stderr.strip().splitlines()) == 1, failed.output
        assert all(w in failed.stderr for w in words), failed.stderr
    assert not math.isnan(manifest["metrics"]["effective_tokens"])
