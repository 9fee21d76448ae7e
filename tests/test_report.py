"""`oarctl report`: a self-contained HTML page (no external URL, every image an inline PNG) that a real
headless browser renders with its curves and heatmaps; plus the row choice and the error paths."""
from __future__ import annotations

import base64
import io
import re
import subprocess
from pathlib import Path

import pytest

from oarctl.report.run_report import choose_rows, curves

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# the embedded toy policy reasons before answering, so entropy weights vary over the reasoning
REPORT_RUN = dict(run={"steps": 2, "progress": False, "eval_every": 1}, policy={"path": "toy"},
                  attribute={"method": "entropy"}, sample={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 40})

IMAGE_PROBE = ('<script>window.addEventListener("load", function () { var n = 0, broken = 0;'
               ' for (const image of document.images) { n++; if (!image.complete || image.naturalWidth === 0) broken++; }'
               ' document.body.setAttribute("data-images", n + " loaded, " + broken + " broken"); });</script>')


def decoded_images(page: str) -> list[bytes]:
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(sources) == page.count("<img"), "every <img> has a src"
    images = []
    for source in sources:
        assert source.startswith("data:image/png;base64,"), source[:60]
        images.append(base64.b64decode(source.split(",", 1)[1], validate=True))
    return images


def assert_valid_png(data: bytes) -> None:
    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    Image.open(io.BytesIO(data)).verify()


def chromium(*args, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_is_self_contained_and_renders_in_a_browser(cli, tiny_config, tmp_path):
    run_dir = tmp_path / "R"
    assert cli("run", "-c", tiny_config(**REPORT_RUN), "--run-dir", run_dir).exit_code == 0
    result = cli("report", run_dir)
    assert result.exit_code == 0, result.output
    page_path = run_dir / "report.html"
    page = page_path.read_text()

    assert not re.search(r"https?://", page), "the page must not reference anything outside itself"
    assert "<script" not in page
    images = decoded_images(page)
    assert len(images) >= 8  # accuracy + 7 step curves, all present in a run with entropy weights
    for data in images:
        assert_valid_png(data)
    written = sorted((run_dir / "report").glob("*.png"))
    assert len(written) == len(images) and {p.read_bytes() for p in written} == set(images)
    assert "not plotted" not in page
    assert page.count('class="rollout"') >= 2 and page.count('class="tok"') > 20 and 'class="answer"' in page

    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is not installed (apt-get install chromium): browser check skipped")
    profile, shot = tmp_path / "profile", tmp_path / "shot.png"
    url = page_path.resolve().as_uri()
    shown = chromium(f"--screenshot={shot}", "--window-size=1200,3000", url, profile=profile)
    assert shot.is_file(), shown.stderr[-2000:]
    dom = chromium("--dump-dom", url, profile=profile)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<img") == len(images) and dom.stdout.count('class="tok"') == page.count('class="tok"')
    assert "Uncaught" not in dom.stderr and "ERR_FILE_NOT_FOUND" not in dom.stderr
    # The page has no script; a test-only copy with a probe asks the browser itself whether every image decoded.
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", IMAGE_PROBE + "</body>"))
    checked = chromium("--dump-dom", probed.resolve().as_uri(), profile=profile)
    assert f'data-images="{len(images)} loaded, 0 broken"' in checked.stdout, checked.stdout[-500:]

    from PIL import Image

    picture = Image.open(shot).convert("RGB")
    assert picture.size == (1200, 3000)
    colours = picture.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "a blank or near-blank screenshot"


def test_row_choice_prefers_mixed_groups_and_takes_both_verdicts():
    rows = [{"prompt_id": "a", "reward": 1.0}, {"prompt_id": "a", "reward": 1.0},  # a: all correct
            {"prompt_id": "b", "reward": 0.0}, {"prompt_id": "b", "reward": 1.0},  # b: mixed
            {"prompt_id": "c", "reward": 0.0}, {"prompt_id": "c", "reward": 0.0}]
    assert choose_rows(rows, per_verdict=1) == [3, 2]
    assert choose_rows(rows, per_verdict=2) == [3, 0, 2, 4]


def test_absent_metrics_are_named_not_plotted():
    lines = [{"kind": "eval", "after_steps": 0, "eval/greedy_accuracy": 0.5, "eval/avg@2": 0.4},
             {"kind": "step", "step": 0, "verify/reward_mean": 0.3}]
    images, missing = curves(lines)
    assert set(images) == {"heldout_accuracy", "reward"}
    assert any("update/kl" in m for m in missing) and len(missing) == 6


def test_report_errors_name_the_folder_or_file(cli, tmp_path):
    failed = cli("report", tmp_path / "nope")
    assert failed.exit_code == 2 and "nope" in failed.stderr and "not found" in failed.stderr
    (tmp_path / "empty").mkdir()
    failed = cli("report", tmp_path / "empty")
    assert failed.exit_code == 2 and "metrics.jsonl" in failed.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text("{not json\n")
    failed = cli("report", tmp_path / "bad")
    assert failed.exit_code == 2 and "not valid JSON" in failed.stderr and len(failed.stderr.splitlines()) == 1


def test_the_run_policy_comes_from_the_first_folder_with_a_config_and_a_bad_one_is_named(tmp_path):
    from oarctl.errors import OarError
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.report.tokens import run_policy

    step, run = tmp_path / "run" / "step_0000", tmp_path / "run"
    step.mkdir(parents=True)
    assert run_policy(step, run) == resolve_policy_path("toy")  # no config: the toy policy
    (run / "config.yaml").write_text("policy: {path: toy-chains}\n")
    assert run_policy(step, run) == resolve_policy_path("toy-chains") != resolve_policy_path("toy")
    for text, says in (("policy: {path: [\n", "not valid YAML"), ("policy: toy-chains\n", "section 'policy'")):
        (run / "config.yaml").write_text(text)  # `oarctl show` and `oarctl report` print this one line
        with pytest.raises(OarError, match=re.escape(f"{run / 'config.yaml'}: {says}")):
            run_policy(step, run)
