"""scripts/keep_seconds.py: a kept run (metrics and config only) keeps its stage seconds per step, and
`oarctl compare`'s readers take them from there once the step folders are gone."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml
from conftest import load_script

from oarctl.report.compare import SECONDS_FILE, STAGE_OUTPUTS, seconds_per_step, stage_seconds

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "keep_seconds.py"


@pytest.fixture(scope="module")
def keep_seconds():
    return load_script(SCRIPT)


def run_folder(out: Path, name: str, steps: int, done: int) -> Path:
    """OUT/<name> with `done` step folders of five stage manifests (stage i of step s took s + i seconds) and
    KEEP-like config.yaml; the kept copy (config only) beside it in out/../kept."""
    folder = out / name
    for step in range(done):
        (folder / f"step_{step:04d}").mkdir(parents=True)
        for i, output in enumerate(STAGE_OUTPUTS.values()):
            manifest = folder / f"step_{step:04d}" / f"{output}{'' if output == 'policy' else '.parquet'}.manifest.json"
            manifest.write_text(json.dumps({"wall_seconds": step + i}))
    kept = out.parent / "kept" / name
    kept.mkdir(parents=True)
    (kept / "config.yaml").write_text(yaml.safe_dump({"run": {"steps": steps}}))
    return kept


def call(module, *arguments) -> tuple[int, str]:
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            module.main([str(a) for a in arguments])
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue()


def test_a_kept_run_keeps_its_stage_seconds_and_compare_reads_them(tmp_path, keep_seconds):
    out, kept = tmp_path / "runs", tmp_path / "kept"
    whole = run_folder(out, "uniform-s1", steps=3, done=3)
    short = run_folder(out, "truth-s1", steps=3, done=2)  # killed before its last step
    code, printed = call(keep_seconds, out, kept)
    assert code == 0
    assert printed == (f"truth-s1: not written: 2 complete step folders in {out / 'truth-s1'}, 3 configured\n"
                       "1 written, 0 already kept, 1 not written\n")
    steps = json.loads((whole / SECONDS_FILE).read_text())["steps"]
    assert steps == [{stage: float(s + i) for i, stage in enumerate(STAGE_OUTPUTS)} for s in range(3)]
    assert not (short / SECONDS_FILE).exists()
    # compare's readers give the same numbers from the kept file as from the step folders
    assert stage_seconds(whole) == stage_seconds(out / "uniform-s1") == {stage: 1.0 + i for i, stage in
                                                                         enumerate(STAGE_OUTPUTS)}
    assert seconds_per_step(whole) == seconds_per_step(out / "uniform-s1") == 15.0  # 10, 15, 20
    assert call(keep_seconds, out, kept) == (0, f"truth-s1: not written: 2 complete step folders in "
                                                f"{out / 'truth-s1'}, 3 configured\n0 written, 1 already kept, "
                                                "1 not written\n")


def test_a_missing_folder_is_one_line(tmp_path, keep_seconds, capsys):
    code, _ = call(keep_seconds, tmp_path / "nowhere", tmp_path)
    assert code == 2 and capsys.readouterr().err == f"error: {tmp_path / 'nowhere'}: not a directory\n"
