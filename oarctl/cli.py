"""The `oarctl` command line: parses arguments and calls the pipeline (one stage) or the loop (run, status).

User errors (bad files, options, configs) print one line and exit with code 2.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from oarctl.errors import OarError
from oarctl.gradient_check import TIME_SAMPLING
from oarctl.options import check_options

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="GRPO with outcome-grounded advantage reshaping, as cacheable Parquet stages.")
toy_app = typer.Typer(no_args_is_help=True, help="The embedded toy world: generated prompts, base policy.")
app.add_typer(toy_app, name="toy")

ConfigOption = typer.Option(None, "-c", "--config", help="YAML config file")
SetOption = typer.Option(None, "--set", help="override: section.key=value (repeatable)")
OutputOption = typer.Option(..., "-o", "--output", help="output path")
PolicyOption = typer.Option(None, "--policy", help="policy folder (default: policy.path of the config)")
StepOption = typer.Option(0, "--step", help="RL step index (seeds sampling and the prompt draw)")
ForceOption = typer.Option(False, "--force", help="recompute even if the output is up to date")
# A stage's input file, named by the stage that writes it
RolloutsArgument = typer.Argument(..., help="rollouts file (written by sample)")
VerifiedArgument = typer.Argument(..., help="verified file (written by verify)")
AttributionsArgument = typer.Argument(..., help="attributions file (written by attribute)")
AdvantagesArgument = typer.Argument(..., help="advantages file (written by reshape)")
RunDirArgument = typer.Argument(..., help="run folder (written by oarctl run)")
PROMPTS_HELP = ("prompts: a Parquet, JSONL or JSON file, a folder saved by datasets, or a hub dataset "
                "name[:config]:split (columns: data.problem_column / data.answer_column)")


def user_errors(command):
    """Check the options against their table (oarctl/options.py), then run; OarError becomes
    `error: ...` on stderr and exit code 2, never a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            check_options(command, kwargs)
            return command(*args, **kwargs)
        except OarError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2)
    return wrapper


def _config(config_file: Optional[Path], overrides: Optional[List[str]]):
    from oarctl.config import load_config
    return load_config(config_file, overrides or [])


def _log(message: str) -> None:
    typer.echo(message, err=True)


def _stage_command(name: str, input_path: Path, output: Path, config_file, overrides, *, policy=None,
                   step: int = 0, force: bool = False) -> None:
    from oarctl.pipeline import STAGES, run_stage
    from oarctl.policy.paths import resolve_policy_path

    config = _config(config_file, overrides)
    (input_name,) = STAGES[name].inputs
    if STAGES[name].inputs[input_name] == "prompts":  # the user's prompts, as `oarctl run` reads data.train
        from oarctl.data import stage_prompts

        input_path = stage_prompts(str(input_path), output, config, "train", log=_log)
    policy_path = None
    if STAGES[name].uses_policy:
        policy_path = Path(policy) if policy else resolve_policy_path(config.policy.path)
    try:
        manifest, ran = run_stage(name, config, {input_name: input_path}, output, step=step,
                                  policy_path=policy_path, force=force, log=_log)
    finally:
        if "torch" in sys.modules:  # a stage that never imported torch joined no process group
            from oarctl.distributed import release_process_group

            release_process_group()
    metrics = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in manifest["metrics"].items())
    typer.echo(f"{name}: {'wrote' if ran else 'up to date'} {output}  {metrics}")
    _leave_if_launched()


def _leave_if_launched() -> None:
    """A launched rank whose stage is done (output and manifest written by rank 0, process group shut down)
    leaves without the interpreter's teardown: about one exit in ten on 2 busy CPU ranks aborted there in
    C++ ("terminate called without an active exception"), failing a stage that had succeeded."""
    from oarctl.distributed import launched

    if launched() and "torch" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@app.command()
@user_errors
def sample(prompts: Path = typer.Argument(..., help=PROMPTS_HELP), output: Path = OutputOption,
           policy: Optional[Path] = PolicyOption, step: int = StepOption,
           config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Sample a group of responses for this step's prompts -> rollouts."""
    _stage_command("sample", prompts, output, config, set, policy=policy, step=step, force=force)


@app.command()
@user_errors
def verify(rollouts: Path = RolloutsArgument, output: Path = OutputOption, policy: Optional[Path] = PolicyOption,
           config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Grade every response -> verified (extracted answer, its character and token spans, reward).
    The policy that sampled the rollouts gives the tokenizer for the token span."""
    _stage_command("verify", rollouts, output, config, set, policy=policy, force=force)


@app.command()
@user_errors
def attribute(verified: Path = VerifiedArgument, output: Path = OutputOption, method: Optional[str] = typer.Option(
        None, "--method", help="attribution method (overrides attribute.method)"),
        policy: Optional[Path] = PolicyOption, step: int = StepOption, config: Optional[Path] = ConfigOption,
        set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Score every response token -> attributions."""
    overrides = list(set or []) + ([f"attribute.method={method}"] if method else [])
    _stage_command("attribute", verified, output, config, overrides, policy=policy, step=step, force=force)


@app.command()
@user_errors
def reshape(attributions: Path = AttributionsArgument, output: Path = OutputOption,
            config: Optional[Path] = ConfigOption,
            set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Turn rewards and token scores into token advantages -> advantages."""
    _stage_command("reshape", attributions, output, config, set, force=force)


@app.command()
@user_errors
def update(advantages: Path = AdvantagesArgument, output: Path = OutputOption, policy: Optional[Path] = PolicyOption,
           step: int = StepOption, config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption,
           force: bool = ForceOption):
    """One policy-gradient step on the token advantages -> a policy folder (with update.parquet)."""
    _stage_command("update", advantages, output, config, set, policy=policy, step=step, force=force)


@app.command("update-worker", hidden=True)
@user_errors
def update_worker(folder: Path = typer.Argument(..., help="the folder of its requests"),
                  config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption):
    """The ranks of a persistent update worker (update.persistent): launched once by `oarctl run`,
    they answer one update request per step from FOLDER (oarctl/processes/update_worker.py)."""
    from oarctl.pipeline import run_stage
    from oarctl.processes.update_worker import serve

    try:
        serve(folder, _config(config, set), _log, run_stage)
    finally:
        from oarctl.distributed import release_process_group

        release_process_group()
    _leave_if_launched()


@app.command()
@user_errors
def evaluate(prompts: Optional[Path] = typer.Argument(None, help=PROMPTS_HELP + "; omit when evaluate.benchmarks is set"),
             output: Path = OutputOption, policy: Optional[Path] = PolicyOption,
             config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Greedy accuracy, avg@k, pass@k and maj@k of a policy on held-out prompts or on every
    benchmark of evaluate.benchmarks -> eval results, plus <output>.summary.md / .summary.json."""
    import time

    from oarctl.loop import evaluate_command
    from oarctl.policy.paths import resolve_policy_path
    from oarctl.summary import markdown

    settings = _config(config, set)
    started = time.perf_counter()
    manifest, ran = evaluate_command(settings, prompts, output, Path(policy) if policy else
                                     resolve_policy_path(settings.policy.path), force=force, log=_log)
    typer.echo(f"evaluate: {'wrote' if ran else 'up to date'} {output}  ({time.perf_counter() - started:.1f} s; "
               f"summary: {output.name}.summary.md)")
    typer.echo(markdown(manifest["metrics"]), nl=False)


@app.command()
@user_errors
def run(config: Optional[Path] = ConfigOption, run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", help="run folder (default: runs/<config name>)"),
        steps: Optional[int] = typer.Option(None, "--steps", help="number of RL steps (overrides run.steps)"),
        set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """The whole loop: evaluate base, then sample -> verify -> attribute -> reshape -> update per step."""
    import time

    from oarctl.loop import run_loop

    overrides = list(set or []) + ([f"run.steps={steps}"] if steps is not None else [])
    settings = _config(config, overrides)
    folder = run_dir or Path("runs") / (config.stem if config else "default")
    started = time.perf_counter()
    summary = run_loop(settings, folder, force=force, log=_log)
    base, final = summary["base"], summary["final"]
    sampled = next(key for key in base if key.startswith("eval/avg@"))
    typer.echo(f"run folder: {folder}  ({time.perf_counter() - started:.0f} s)")
    typer.echo(f"held-out accuracy: base {100 * base['eval/greedy_accuracy']:.1f}% -> trained "
               f"{100 * final['eval/greedy_accuracy']:.1f}% (greedy; sampled {sampled[5:]} "
               f"{100 * base[sampled]:.1f}% -> {100 * final[sampled]:.1f}%)")


@app.command()
@user_errors
def show(path: Path = typer.Argument(..., help="a .parquet artifact, a .manifest.json or a metrics.jsonl"),
         rows: int = typer.Option(5, "--rows", "-n", help="rows to print"),
         row: Optional[int] = typer.Option(None, "--row", help="one row as a per-token heatmap"),
         by: Optional[str] = typer.Option(None, "--by", help="heatmap values: weight, score or advantage "
                                          "(default: weight for advantages files, score for attributions)"),
         policy: Optional[Path] = typer.Option(None, "--policy", help="tokenizer folder for decoding "
                                               "(default: the run's policy.path, else the toy policy)"),
         color: Optional[bool] = typer.Option(None, "--color/--no-color", help="colour the heatmap (default: only "
                                              "on a terminal and without NO_COLOR; --color for `| less -R`)")):
    """Print an artifact's schema, row count and first rows (or a manifest / metrics file)."""
    if row is not None:
        from oarctl.report.tokens import show_row, wants_color
        color = wants_color(color, sys.stdout)
        typer.echo(show_row(path, row, by, policy, color=color), color=color)
        return
    from oarctl.inspect import show_file
    typer.echo(show_file(path, rows))


@app.command()
@user_errors
def report(run_dir: Path = RunDirArgument, output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="HTML page (default: RUN_DIR/report.html; PNGs go to RUN_DIR/report/)")):
    """One self-contained HTML page of a run: training curves and token-credit heatmaps."""
    from oarctl.report.run_report import write_report

    typer.echo(f"wrote {write_report(run_dir, output, log=_log)}")


@app.command()
@user_errors
def compare(run_dirs: List[Path] = typer.Argument(..., help="run folders (one per method and seed)"),
            output: Path = typer.Option(
        Path("compare.html"), "-o", "--output", help="HTML page; the table also goes to OUTPUT with .md"),
        target: Optional[float] = typer.Option(None, "--target", help="held-out greedy accuracy for "
                                               "'steps to target' (default 0.45)"),
        allow_mixed: bool = typer.Option(False, "--allow-mixed", help="compare runs whose machine or versions differ "
                                         "or were not recorded (refused otherwise)")):
    """Runs grouped by attribute.method, mean ± std over seeds: accuracy, steps to target, time per step."""
    from oarctl.report.compare import compare_runs

    typer.echo(compare_runs(run_dirs, output, target, log=_log, allow_mixed=allow_mixed), nl=False)


@app.command()
@user_errors
def status(run_dir: Path = RunDirArgument, config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption):
    """Which stages of which steps are done, and why the others would run."""
    from oarctl.loop import require_run_folder, run_status

    if not run_dir.is_dir():
        raise OarError(f"{run_dir}: run folder not found")
    require_run_folder(run_dir, config is not None)
    recorded = run_dir / "config.yaml"
    settings = _config(config or (recorded if recorded.exists() else None), set)
    for where, stage, state in run_status(run_dir, settings):
        typer.echo(f"{where:<12} {stage:<10} {state}")


@app.command()
@user_errors
def fidelity(verified: Path = VerifiedArgument, output: Path = OutputOption, policy: Optional[Path] = PolicyOption,
             sample_size: Optional[int] = typer.Option(None, "--sample", help="rollouts drawn (fidelity.sample)"),
             methods: Optional[str] = typer.Option(None, "--methods", help="comma-separated (fidelity.methods)"),
             config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption, force: bool = ForceOption):
    """Recall of each method's top-K% tokens against a counterfactual oracle -> fidelity (+ .md, .png).
    Cached like a stage: the same input, policy and options reuse the finished output."""
    from oarctl.fidelity import run_fidelity
    from oarctl.policy.paths import resolve_policy_path

    overrides = list(set or [])
    if sample_size is not None:
        overrides.append(f"fidelity.sample={sample_size}")
    if methods is not None:
        names = [name.strip() for name in methods.split(",") if name.strip()]
        if not names:
            raise OarError("--methods: expected comma-separated attribution method names")
        overrides.append(f"fidelity.methods=[{', '.join(names)}]")
    settings = _config(config, overrides)
    policy_path = Path(policy) if policy else resolve_policy_path(settings.policy.path)
    report, ran = run_fidelity(verified, output, settings, policy_path, log=_log, force=force)
    typer.echo(report)
    files = f"{output}, {output.with_suffix('.md')}, {output.with_suffix('.png')}"
    typer.echo(f"{'wrote' if ran else 'up to date'} {files}")


@app.command("gradient-check")
@user_errors
def gradient_check(verified: Path = VerifiedArgument, output: Path = OutputOption, policy: Optional[Path] = PolicyOption,
                   methods: str = typer.Option("uniform,truth,oar_flow_local", "--methods",
                                               help="comma-separated attribution methods (uniform is always run)"),
                   batch_prompts: Optional[int] = typer.Option(None, "--batch-prompts", help="prompts per scored batch "
                                                               "(default: sample.prompts_per_step, a training batch)"),
                   sample_seconds: Optional[float] = typer.Option(None, "--sample-seconds", help="seconds sampling the "
                                                                  "pool took (default: timed here, --time-sampling)"),
                   time_sampling: int = typer.Option(TIME_SAMPLING, "--time-sampling", help="prompts of the pool sampled again "
                                                     "to time sampling under the credit's load (0: the pool's sample "
                                                     "manifest's seconds)"),
                   config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption):
    """How well one batch's gradient under each credit method points along the policy gradient, measured
    on a pool of the policy's own rollouts -> a table (+ .md, .png). Reshaping knobs: --set reshape.KEY=..."""
    from oarctl.gradient_check import run_gradient_check
    from oarctl.policy.paths import resolve_policy_path

    settings = _config(config, set)
    policy_path = Path(policy) if policy else resolve_policy_path(settings.policy.path)
    names = [name.strip() for name in methods.split(",") if name.strip()]
    typer.echo(run_gradient_check(verified, output, settings, policy_path, names, batch_prompts, sample_seconds,
                                  time_sampling, log=_log))
    typer.echo(f"wrote {output}, {output.with_suffix('.md')}, {output.with_suffix('.png')}")


@app.command("config")
@user_errors
def show_config(config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption,
                explain: bool = typer.Option(False, "--explain", help="every option with its help")):
    """Print the resolved config (defaults + file + overrides), or every option's help."""
    import yaml

    from oarctl.config import explain as explain_options
    from oarctl.schema import to_dict
    typer.echo(explain_options() if explain else yaml.safe_dump(to_dict(_config(config, set)), sort_keys=False))


@toy_app.command("prompts")
@user_errors
def toy_prompts(output: Path = OutputOption, split: str = typer.Option("train", help="train or heldout"),
                count: int = typer.Option(256, "-n", help="number of problems"),
                config: Optional[Path] = ConfigOption, set: Optional[List[str]] = SetOption):
    """Write generated toy prompts (the same sets `oarctl run` uses) to a Parquet file."""
    from oarctl.artifacts import write_parquet
    from oarctl.data import toy_prompts as generate_prompts

    if split not in ("train", "heldout"):
        raise OarError(f"--split: expected train or heldout, got {split!r}")
    settings = _config(config, set)
    from oarctl.toy.families import configured_levels

    write_parquet(generate_prompts(split, count, configured_levels(settings.data), settings.run.seed,
                                   settings.data.toy_family), output)
    typer.echo(f"wrote {count} {split} prompts to {output}")


@toy_app.command("build")
@user_errors
def toy_build(output: Path = typer.Option(None, "-o", "--output", help="default: the family's shipped policy folder"),
              seed: int = typer.Option(0, help="training seed"),
              family: str = typer.Option("arithmetic", help="task family: arithmetic, chains or chains_wide"),
              state: Optional[Path] = typer.Option(None, help="save the training state here and resume from it"),
              time_limit: Optional[float] = typer.Option(None, help="with --state: pause after N seconds")):
    """Rebuild an embedded base policy by supervised warm start, with the recipe it shipped with
    (arithmetic ~18 min, chains longer on 2 cores; --state/--time-limit make it pausable)."""
    from oarctl.toy import policy_folder
    from oarctl.toy.pretrain import RECIPES, pretrain

    if family not in RECIPES:
        raise OarError(f"--family: expected one of {', '.join(RECIPES)}, got {family!r}")
    result = pretrain(output or policy_folder(family), seed=seed, log=_log, family=family, state_dir=state,
                      time_limit=time_limit, **RECIPES[family])
    typer.echo(f"base policy: {result}")


def main() -> None:  # pragma: no cover
    if "WORLD_SIZE" in os.environ:  # a rank under accelerate launch / torchrun
        from oarctl.processes.launch import rank_dies_with_launcher

        rank_dies_with_launcher()
    sys.exit(app())


if __name__ == "__main__":  # `python -m oarctl.cli`, as the tests run it
    main()
