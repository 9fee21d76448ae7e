"""oarctl artifacts of a TRL run (`OARGRPOTrainer(oar_log_dir=...)`), in the layout of an `oarctl run`
folder, so `oarctl show --row`, `oarctl report` and `oarctl fidelity` read them:

    OAR_LOG_DIR/config.yaml         oarctl config: the attribute / reshape sections used, run.seed, reshape.scale
                                    and eps as TRL's advantage has them, policy.path = tokenizer/
    OAR_LOG_DIR/tokenizer/          the policy's tokenizer (decodes the heatmaps)
    OAR_LOG_DIR/metrics.jsonl       one `step` line per generated batch (verify/, sample/, reshape/, attribute/;
                                    update/ from TRL's next log, averaged over its logging_steps)
    OAR_LOG_DIR/step_NNNN/advantages.parquet (+ .manifest.json)   NNNN = TRL's global step at generation

Rows are the whole batch (every process's completions, in TRL's order). `reward` is TRL's total reward,
the one the advantage used (0 for completions no reward function scored); the verify columns
(extracted answer, verdict, spans) are oarctl's `boxed` check against the dataset's `answer` column
when it has one (empty gold otherwise), so they describe the text, not the reward. Only the main
process writes; a resumed run rewrites metrics.jsonl lines from its first step on.
"""
from __future__ import annotations

import copy
import json
import shutil
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from oarctl.advantages import SCALES
from oarctl.artifacts import make_table, temporary_sibling, write_bytes_atomically, write_parquet
from oarctl.attribution.rows import outcome_mode, span_columns
from oarctl.checkpoints import replace_directory
from oarctl.distributed import rank
from oarctl.errors import OarError
from oarctl.hashing import sha256_file
from oarctl.schema import section_dict, to_dict

TRL_VERSIONS = ("1.16", "2")  # supported: >= first, < second (pyproject's `trl` extra says the same)
TRL_ADVANTAGE_EPS = 1e-4  # TRL divides by std + 1e-4
VERSION = "1"
# TRL log key -> metrics.jsonl key (the names of `oarctl run`'s update stage)
UPDATE_METRICS = {"loss": "update/loss", "entropy": "update/entropy", "kl": "update/kl",
                  "clip_ratio/region_mean": "update/clip_fraction", "grad_norm": "update/grad_norm"}


def check_trl_version() -> None:
    from packaging.version import Version

    try:
        installed = metadata.version("trl")
    except metadata.PackageNotFoundError:
        raise OarError("oarctl.integrations.trl needs TRL: pip install 'oarctl[trl]'") from None
    low, high = TRL_VERSIONS
    if not Version(low) <= Version(installed) < Version(high):
        raise OarError(f"oarctl.integrations.trl supports trl >= {low}, < {high}; installed: {installed}")


def _problem(prompt) -> str:
    """The prompt as text: conversational prompts show their last message."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = prompt[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return str(prompt)


def row_columns(batch: dict, index: int, weights: np.ndarray, logprobs: list[float], tokenizer, *, method: str,
                mode: str | None, group_size: int, eos_ids: list[int]) -> dict:
    """The rollout, attribution and advantage columns of one row of this process's batch."""
    table, rollout = batch["table"], batch["rollouts"][index]
    ids = table["response_token_ids"][index].as_py()
    advantage = float(batch["advantages"][index])
    example = batch["inputs"][index]
    spans = {name: values[0] for name, values in span_columns([rollout], mode).items()}
    return {"prompt_id": table["prompt_id"][index].as_py(), "problem": _problem(example.get("prompt", "")),
            "answer": str(example.get("answer", "") or ""), "sample_index": rollout.row % group_size,
            "prompt_token_ids": table["prompt_token_ids"][index].as_py(), "response_token_ids": ids,
            "response_logprobs": logprobs, "response_text": tokenizer.decode(ids, skip_special_tokens=True),
            "finish_reason": "stop" if ids and ids[-1] in eos_ids else "length",
            "temperature": table["temperature"][index].as_py(), "reward": table["reward"][index].as_py(),
            "attribution_method": method, **spans, "token_scores": batch["scores"][index].tolist(),
            "token_weights": weights.tolist(), "token_advantages": (advantage * weights.astype(np.float64)).tolist()}


def verify_columns(rows: list[dict], tokenizer) -> dict:
    """oarctl's boxed check of each response against its gold answer, with the answer's token span."""
    from oarctl.verify import CHECKERS, verdict_columns
    from oarctl.verify.token_span import token_span

    verdicts = CHECKERS.get("boxed")([r["response_text"] for r in rows], [r["answer"] for r in rows])
    spans = [token_span(tokenizer, r["response_token_ids"], v.start, v.end) for r, v in zip(rows, verdicts)]
    return {**verdict_columns(verdicts, "strict"),  # the boxed check reads the last box: strict
            "answer_token_start": [s for s, _ in spans], "answer_token_end": [e for _, e in spans]}


class StepLog:
    """Writes OAR_LOG_DIR (see the module docstring); every method is called on the main process only,
    except `row_columns`, which each process calls on its own rows."""

    def __init__(self, folder, config, trainer):
        self.folder = Path(folder)
        self.tokenizer = trainer.processing_class
        self.group_size, self.eos_ids = trainer.num_generations, list(trainer.eos_token_ids)
        self.config = copy.deepcopy(config)
        self.config.policy.path = str((self.folder / "tokenizer").resolve())
        if trainer.scale_rewards in SCALES:  # what `oarctl reshape` needs to recompute TRL's advantages
            self.config.reshape.scale = trainer.scale_rewards
        self.config.reshape.eps = TRL_ADVANTAGE_EPS
        self.lines: list[dict] = []
        if rank() == 0:
            self._prepare()

    def _prepare(self) -> None:
        import yaml

        temporary = temporary_sibling(self.folder / "tokenizer")
        shutil.rmtree(temporary, ignore_errors=True)
        self.tokenizer.save_pretrained(temporary)
        replace_directory(temporary, self.folder / "tokenizer")
        write_bytes_atomically(self.folder / "config.yaml", yaml.safe_dump(to_dict(self.config), sort_keys=False))
        metrics = self.folder / "metrics.jsonl"
        if metrics.is_file():
            self.lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]

    def row_columns(self, batch: dict, index: int, weights: np.ndarray, logprobs: list[float]) -> dict:
        attribute = self.config.attribute
        return row_columns(batch, index, weights, logprobs, self.tokenizer, method=attribute.method,
                           mode=outcome_mode(attribute), group_size=self.group_size, eos_ids=self.eos_ids)

    def write(self, step: int, rows: list[dict], seconds: float, trl_metrics: dict) -> None:
        """step_NNNN/advantages.parquet, its manifest (written last), then the metrics.jsonl line."""
        started = time.perf_counter()
        columns = {name: [row[name] for row in rows] for name in rows[0] if name not in ("row", "reasoning_weights")}
        columns.update(verify_columns(rows, self.tokenizer))
        output = self.folder / f"step_{step:04d}" / "advantages.parquet"
        write_parquet(make_table(columns, "advantages"), output)
        metrics = self._metrics(step, rows, seconds, trl_metrics)
        self._write_manifest(output, step, metrics, seconds + time.perf_counter() - started)
        self.lines = [line for line in self.lines if line.get("kind") != "step" or line["step"] < step]
        self.lines.append({"kind": "step", "step": step, **metrics})
        write_bytes_atomically(self.folder / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in self.lines))

    def add_update_metrics(self, logs: dict) -> None:
        """TRL's loss-side metrics (logged after the update) join the last step line, under the names
        `oarctl report` plots."""
        found = {ours: float(logs[theirs]) for theirs, ours in UPDATE_METRICS.items()
                 if isinstance(logs.get(theirs), (int, float))}
        steps = [line for line in self.lines if line.get("kind") == "step"]
        if found and steps:
            steps[-1].update(found)
            write_bytes_atomically(self.folder / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in self.lines))

    def _metrics(self, step: int, rows: list[dict], seconds: float, trl_metrics: dict) -> dict:
        rewards = [row["reward"] for row in rows]
        metrics = {"verify/reward_mean": float(np.mean(rewards)),
                   "sample/response_length_mean": float(np.mean([len(r["response_token_ids"]) for r in rows])),
                   "reshape/advantage_abs_mean": float(np.mean([abs(r["advantage"]) for r in rows])),
                   "attribute/seconds": seconds}
        for name in ("top10_mass_share", "effective_tokens", "effective_token_fraction"):
            if trl_metrics.get(f"oar/{name}"):
                metrics[f"reshape/{name}"] = trl_metrics[f"oar/{name}"][-1]
        return metrics

    def _write_manifest(self, output: Path, step: int, metrics: dict, seconds: float) -> None:
        from oarctl.runner import write_manifest

        parts = {"stage": "trl_oar", "version": VERSION, "inputs": {}, "seed": self.config.run.seed, "step": step,
                 "config": {"attribute": section_dict(self.config, "attribute"),
                            "reshape": section_dict(self.config, "reshape"), "trl": metadata.version("trl")}}
        write_manifest(output, parts, metrics, seconds, sha256_file(output))
