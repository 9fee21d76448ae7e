"""`oarctl compare`: grouping by method, mean ± std over seeds, steps to target, time per step, on
handmade run folders whose numbers are computed by hand."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import yaml


# where every fake run ran (the fields oarctl/provenance.py compares); tests/test_provenance.py varies it
PROVENANCE = {"oarctl": {"version": "0.1.0", "source_sha256": "0" * 16}, "versions": {"torch": "2.13.0"},
              "machine": {"cpu": "test CPU", "cpu_capability": "AVX2", "gpu": None, "gpus": 0}}


def fake_run(folder: Path, method: str, seed: int, accuracy: list[float], rewards: list[float],
             seconds: float) -> Path:
    """A run folder as `oarctl run` leaves it: config.yaml, metrics.jsonl, step manifests."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": seed}, "attribute": {"method": method},
                                                        "provenance": PROVENANCE}))
    lines = [{"kind": "eval", "after_steps": 2 * i, "eval/greedy_accuracy": a, "eval/avg@4": a / 2}
             for i, a in enumerate(accuracy)]
    lines += [{"kind": "step", "step": s, "verify/reward_mean": r} for s, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for step in range(len(rewards)):
        step_folder = folder / f"step_{step:04d}"
        step_folder.mkdir()
        for name in ("rollouts.parquet", "advantages.parquet", "policy"):  # stage times add up per step
            (step_folder / f"{name}.manifest.json").write_text(json.dumps({"wall_seconds": seconds / 3,
                                                                             "provenance": PROVENANCE}))
    return folder


def test_compare_groups_methods_and_aggregates_seeds(cli, tmp_path):
    runs = [fake_run(tmp_path / "u0", "uniform", 0, [0.40, 0.42, 0.44], [0.3, 0.3, 0.4, 0.4], 3.0),
            fake_run(tmp_path / "u1", "uniform", 1, [0.40, 0.44, 0.46], [0.3, 0.4, 0.4, 0.5], 6.0),
            fake_run(tmp_path / "p0", "oar_p", 0, [0.40, 0.46, 0.50], [0.3, 0.5, 0.5, 0.6], 9.0)]
    output = tmp_path / "out" / "compare.html"
    result = cli("compare", *runs, "-o", output, "--target", 0.45)
    assert result.exit_code == 0, result.output
    main = result.stdout.split("\n\n")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in main.splitlines() if line.startswith("| ")}
    assert rows["uniform"] == "| uniform | 2 | 0,1 | 45.0 ± 1.4% | 22.5 ± 0.7% | 4 (1/2 seeds) | 4.50 |"
    assert rows["oar_p"] == "| oar_p | 1 | 0 | 50.0 ± 0.0% | 25.0 ± 0.0% | 2 (1/1 seeds) | 9.00 |"
    assert "steps to 45%" in rows["method"]
    assert output.with_suffix(".md").read_text() == result.stdout
    page = output.read_text()
    assert "<table>" in page and "oar_p" in page and not re.search(r"https?://", page)
    sources = re.findall(r'<img[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(sources) == 2 and all(base64.b64decode(s)[:4] == b"\x89PNG" for s in sources)
    assert sorted(p.name for p in (output.parent / "compare").glob("*.png")) == ["accuracy.png", "reward.png"]


def test_compare_never_reaching_the_target_prints_a_dash(cli, tmp_path):
    run = fake_run(tmp_path / "r", "entropy", 3, [0.1, 0.2], [0.1], 1.0)
    result = cli("compare", run, "-o", tmp_path / "c.html")
    assert result.exit_code == 0, result.output
    assert "| entropy | 1 | 3 | 20.0 ± 0.0% | 10.0 ± 0.0% | — | 1.00 |" in result.stdout


def test_steps_to_target_count_training_steps_not_the_base_evaluation(cli, tmp_path):
    """A base already at the target: the first *trained* evaluation at or above it counts (after 4 steps)."""
    run = fake_run(tmp_path / "r", "oar_g", 0, [0.50, 0.40, 0.48], [0.1, 0.2, 0.3, 0.4], 4.0)
    result = cli("compare", run, "-o", tmp_path / "c.html", "--target", 0.45)
    assert result.exit_code == 0, result.output
    assert "| oar_g | 1 | 0 | 48.0 ± 0.0% | 24.0 ± 0.0% | 4 (1/1 seeds) | 4.00 |" in result.stdout


def test_compare_errors_name_the_run(cli, tmp_path):
    (tmp_path / "not_a_run").mkdir()
    failed = cli("compare", tmp_path / "not_a_run", "-o", tmp_path / "c.html")
    assert failed.exit_code == 2 and "config.yaml" in failed.stderr and len(failed.stderr.splitlines()) == 1
    assert not (tmp_path / "c.html").exists()
    config = tmp_path / "not_a_run" / "config.yaml"
    for text, says in (("run: {seed: [1\n", "not valid YAML"), ("- a list\n", "expected a mapping")):
        config.write_text(text)  # a malformed config is one line naming it, never a YAML traceback
        failed = cli("compare", tmp_path / "not_a_run", "-o", tmp_path / "c.html")
        assert failed.exit_code == 2 and len(failed.stderr.splitlines()) == 1, failed.output
        assert failed.stderr.startswith(f"error: {config}: {says}")
        assert not (tmp_path / "c.html").exists()


def test_paired_differences_to_grpo_with_a_t_interval_computed_by_hand(cli, tmp_path):
    """Seeds 0-2: truth - uniform = +4, +6, +8 points: mean 6, sample std 2, t(2) = 4.303, so the
    half-width is 4.303 * 2 / sqrt(3) = 4.97 points: [+1.0, +11.0], excludes 0. random: +2, -2, 0 ->
    mean 0, std 2, [-5.0, +5.0]. A method without two shared seeds gets no row."""
    runs = []
    for seed, (base, truth, chance) in enumerate([(0.30, 0.34, 0.32), (0.40, 0.46, 0.38), (0.50, 0.58, 0.50)]):
        runs += [fake_run(tmp_path / f"u{seed}", "uniform", seed, [0.3, base], [0.1], 1.0),
                 fake_run(tmp_path / f"t{seed}", "truth", seed, [0.3, truth], [0.1], 1.0),
                 fake_run(tmp_path / f"r{seed}", "random", seed, [0.3, chance], [0.1], 1.0)]
    runs.append(fake_run(tmp_path / "g9", "oar_g", 9, [0.3, 0.9], [0.1], 1.0))  # seed 9 has no uniform run
    result = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert result.exit_code == 0, result.output
    greedy, sampled = result.stdout.split("Seconds per step")[0].split("Paired difference")[1:3]
    rows = {line.split(" | ")[0].strip("| "): line for line in greedy.splitlines() if line.startswith("| ")}
    assert rows["truth"] == "| truth | 3 | +6.0 | [+1.0, +11.0] | 3/3 | yes |"
    assert rows["random"] == "| random | 3 | +0.0 | [-5.0, +5.0] | 1/3 | no |"
    assert "oar_g" not in rows and "uniform" not in rows
    # sampled avg@4 is half the greedy accuracy in these runs: +2, +3, +4 -> mean 3, std 1, [+0.5, +5.5]
    assert sampled.startswith(" to uniform (sampled avg@4,")
    rows = {line.split(" | ")[0].strip("| "): line for line in sampled.splitlines() if line.startswith("| ")}
    assert rows["truth"] == "| truth | 3 | +3.0 | [+0.5, +5.5] | 3/3 | yes |"
    assert rows["random"] == "| random | 3 | +0.0 | [-2.5, +2.5] | 1/3 | no |"
    page = (tmp_path / "compare.html").read_text()  # each paired table under its own title
    assert "<h2>Paired difference to uniform (greedy accuracy," in page
    assert "<h2>Paired difference to uniform (sampled avg@4," in page
    assert page.count("<th>method</th>") == 4  # the main table, 2 paired tables, seconds by stage


def test_on_policy_accuracy_is_paired_over_the_steps_after_the_first(cli, tmp_path):
    """Training rewards per step; step 0 (the base) is left out of the mean. uniform: (0.3+0.4)/2,
    (0.4+0.4)/2, (0.3+0.5)/2 = 0.35, 0.40, 0.40; truth: 0.45, 0.50, 0.55. Differences +10, +10, +15
    points: mean 11.67, sample std 2.887, half-width 4.303 * 2.887 / sqrt(3) = 7.17 -> [+4.5, +18.8].
    A step-0 reward that differs (0.9) must change nothing."""
    runs = []
    for seed, (uniform, truth) in enumerate([([0.2, 0.3, 0.4], [0.9, 0.4, 0.5]), ([0.2, 0.4, 0.4], [0.2, 0.5, 0.5]),
                                              ([0.2, 0.3, 0.5], [0.2, 0.5, 0.6])]):
        runs += [fake_run(tmp_path / f"u{seed}", "uniform", seed, [0.3, 0.5], uniform, 3.0),
                 fake_run(tmp_path / f"t{seed}", "truth", seed, [0.3, 0.5], truth, 6.0)]
    result = cli("compare", *runs, "-o", tmp_path / "compare.html")
    assert result.exit_code == 0, result.output
    on_policy = result.stdout.split("Paired difference to uniform (on-policy accuracy")[1]
    assert "| truth | 3 | +11.7 | [+4.5, +18.8] | 3/3 | yes |" in on_policy.split("Seconds per step")[0]
    # fake_run gives each step 3 stage manifests of seconds / 3: sample, reshape and update
    stages = result.stdout.split("Seconds per step by stage")[1]
    assert "| method | sample | reshape | update | step total |" in stages
    assert "| truth | 2.0 | 2.0 | 2.0 | 6.0 |" in stages and "| uniform | 1.0 | 1.0 | 1.0 | 3.0 |" in stages


def test_runs_with_changed_reshape_options_are_their_own_method():
    from oarctl.report.compare import method_label

    assert method_label({"attribute": {"method": "truth"}}) == "truth"
    assert method_label({"attribute": {"method": "truth"}, "reshape": {"quantile": 0.25, "beta": 1.0}}) == "truth"
    label = method_label(yaml.safe_load("attribute: {method: truth}\nreshape: {quantile: 0.75, floor: 0.0}"))
    assert label == "truth [floor=0.0, quantile=0.75]"
    assert method_label({"run": {"group": "uniform_lr3x"}, "attribute": {"method": "uniform"}}) == "uniform_lr3x"


def test_compare_says_where_it_wrote_and_why_the_paired_section_is_missing(cli, tmp_path):
    runs = [fake_run(tmp_path / "u0", "uniform", 0, [0.40, 0.42], [0.3, 0.4], 3.0),
            fake_run(tmp_path / "p0", "oar_p", 0, [0.40, 0.46], [0.3, 0.5], 3.0)]
    output = tmp_path / "out" / "c.html"
    result = cli("compare", *runs, "-o", output)
    assert result.exit_code == 0, result.output
    note = ("No paired differences: a method needs runs of at least 2 seeds that uniform also ran "
            "(seeds here: oar_p [0]; uniform [0]).")
    assert note in result.stdout and note in result.stderr and "Paired difference" not in result.stdout
    assert f"wrote {output}, {output.with_suffix('.md')} and 2 figures in {output.parent / 'c'}/" in result.stderr
    assert note in output.read_text()
    without_baseline = cli("compare", runs[1], fake_run(tmp_path / "e0", "entropy", 0, [0.4, 0.4], [0.3, 0.3], 3.0),
                           "-o", tmp_path / "d.html")
    assert "No paired differences: no uniform runs to pair with" in without_baseline.stdout


def test_configured_steps_reads_run_steps_with_the_schema_default_and_names_a_bad_file(tmp_path):
    from oarctl.errors import OarError
    from oarctl.report.compare import configured_steps
    from oarctl.schema import RunConfig

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run": {"steps": 7}}))
    assert configured_steps(tmp_path) == 7
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"attribute": {"method": "uniform"}}))
    assert configured_steps(tmp_path) == RunConfig().steps
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run": {"steps": "many"}}))
    with pytest.raises(OarError, match=re.escape(f"{tmp_path / 'config.yaml'}: run.steps must be an integer")):
        configured_steps(tmp_path)
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(OarError, match="file not found"):
        configured_steps(tmp_path)


def test_complete_steps_are_the_configured_steps_each_with_every_stage():
    from oarctl.report.compare import STAGE_OUTPUTS, complete_steps

    whole = {stage: 1.0 for stage in STAGE_OUTPUTS}
    partial = {stage: 1.0 for stage in list(STAGE_OUTPUTS)[:2]}
    assert complete_steps([whole, whole, partial], 2) == [whole, whole]  # a step past the configured ones is left
    assert complete_steps([whole, partial], 2) is None  # a step lost a stage's manifest
    assert complete_steps([whole], 2) is None  # still training
