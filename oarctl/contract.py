"""What a stage receives and returns: the policy it works with (`Policy`), its context (`StageContext`)
and its result (`StageOutput`). Stages and the runner both import these; the contract imports only the
floors below them (checkpoints, for loading a policy), so a stage needs nothing of the orchestration.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from oarctl.checkpoints import load_policy, load_tokenizer, policy_identity


@dataclass
class Policy:
    """A policy folder, loaded only when a stage asks for the model."""
    path: Path
    device: str = "cpu"
    backend: str = "transformers"  # concrete generation backend (oarctl.policy.backends), never "auto"
    vllm: dict | None = None  # the vllm config section, for backend "vllm"
    dtype: str = "float32"  # of the transformers weights `load` gives (attribute.dtype for attribute)
    verified: bool = False  # its files were checked against checkpoint.json already (ranks sharing that out)
    _loaded: tuple | None = None

    @property
    def identity(self) -> str:
        return policy_identity(self.path)

    def load(self):
        if self._loaded is None:
            self._loaded = load_policy(self.path, self.device, self.dtype, verified=self.verified)
        return self._loaded

    def load_tokenizer(self):
        """The tokenizer alone, for stages that need no weights (e.g. segmentation)."""
        return self._loaded[1] if self._loaded is not None else load_tokenizer(self.path)


def progress_shown(wanted: bool) -> bool:
    """Progress bars (run.progress) only on a terminal, where a bar redraws in place and clears itself:
    written to a pipe or a log file every redraw is a fragment glued to the next stage line."""
    import sys

    return wanted and sys.stderr.isatty()


@dataclass
class StageContext:
    seed: int
    step: int
    policy: Policy | None = None
    reference: Policy | None = None  # only set when the stage needs one (update with a KL term)
    progress: bool = False
    prompt_template: str = "chat"  # data.prompt_template, for the stages that build prompts
    output: Path | None = None  # where the runner writes the stage's output (set by run_cached)
    call_sync: object = None  # a CallSync when the policy is sharded over ranks (attribution/collective.py)
    resident: object = None  # a persistent update worker's training.setup.Resident (the state it keeps)


@dataclass
class StageOutput:
    table: object  # pyarrow.Table
    metrics: dict = field(default_factory=dict)
    trained: object = None  # update only: what it hands the runner to commit (training.save.Trained)
    # update under FSDP: called on every rank once the policy folder is in place, before the manifest, with
    # the checkpoint's I/O metrics; writes the training state and returns the metrics with its I/O added
    after_commit: Callable[[dict], dict] | None = None
