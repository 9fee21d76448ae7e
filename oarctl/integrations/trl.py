"""OARGRPOTrainer: TRL's GRPOTrainer with oarctl's token-level credit (OAR) in place of one advantage
per completion.

Reads what TRL has generated and scored for a batch (prompt and completion token ids, rewards, TRL's
sequence advantages); writes the batch's `advantages` as a (B, T) tensor aligned with TRL's
completion mask, which TRL's loss accepts as it is. Per completion:
1. segment it from its own token ids (`attribution.segments`: reasoning, the `\\boxed{` marker, the
   rollout's extracted answer, or the probe text when it has none);
2. score its reasoning tokens with `attribute.method` of oarctl's registry, on the current policy
   unwrapped from accelerate / DeepSpeed, in eval mode, without touching parameter gradients;
3. Bi-Level weights (`reshaping.batch_response_weights`), 1 outside the reasoning; token advantage = TRL's
   sequence advantage x weight.
With `uniform` every weight is 1 and the loss is stock TRL's. The rule that turns scores into token advantages
is the method's (`credit_rules`): `ktae` adds its key-token values to TRL's sequence advantage (A_i + k_it);
`entropy_mask` (TRL's 80/20 rule) scores nothing here: the trainer sets TRL's `top_entropy_quantile` to
`reshape.top_entropy_quantile` and TRL's loss masks the tokens with oarctl's `credit_rules.high_entropy_mask`
(in place of `get_high_entropy_mask`), on the entropies of TRL's own loss forward, per micro-batch, gathered
over processes, as stock TRL does. Everything else (loss types, clipping, KL,
num_iterations, gradient accumulation, vLLM) stays TRL's: they consume the (B, T) tensor unchanged.

Where this deviates from `oarctl run`: the sequence advantage is TRL's (`scale_rewards`, eps 1e-4,
`multi_objective_aggregation`), not oarctl's reshape.estimator; the policy that attributes is the
one that generated (TRL's current weights), as in oarctl. With `reshape.quantile_carry` the quantile
level carries over each process's completions of a batch, in order (the released code's carry ran over
the rows of one `compute_loss` call).

Processes: each process attributes its own completions. A completion's OAR-G noise is seeded by
(args.seed, global step, its row in the global batch), and OAR-G batches never mix prompts, so token
advantages do not depend on the number of processes as long as a process holds whole groups.
Sharded weights (FSDP1, FSDP2, DeepSpeed ZeRO-3): forwards are collective, and each process has its own
number and lengths of completions. `attribution_params="sharded"` (the default) runs attribution on
the shards: every process makes as many attribution calls as the busiest, padded with dummy calls
(`attribution/collective.py`), for the methods in collective.SYNCED_METHODS; OAR-G's gradient is
taken with respect to the input embeddings only, so no parameter gradient and no reduce-scatter.
`"gathered"` gathers the full weights on every process for the attribution (FSDP1
summon_full_params, ZeRO-3 GatheredParameters; not FSDP2): no padding, any method, but a full copy of the
weights per GPU (at 7B: ~15 GB in bf16 under ZeRO-3; ~30 GB under FSDP1, whose summon_full_params
gathers full precision; `bench/scale.py --trl`). Without CUDA an FSDP launch stays FSDP (gloo; accelerate
would run it as DDP), fp32 only, as oarctl's update stage does (`distributed.keep_fsdp_on_cpu`).
Refused at construction (they cannot carry token advantages here): tools / environment_factory
(tool turns inside the completion), vision-language models (attribution feeds token ids only),
attribution_params="gathered" under FSDP2.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from oarctl.attribution import ATTRIBUTION_METHODS
from oarctl.attribution.collective import SYNCED_METHODS, CallSync, fsdp_gathered
from oarctl.attribution.base import segment_rows
from oarctl.attribution.rows import rows_to_score
from oarctl.config import set_option, validate
from oarctl.contract import StageContext
from oarctl.distributed import fsdp_requested, keep_fsdp_on_cpu, quiet_deepspeed_without_gpus, rank
from oarctl.errors import OarError
from oarctl.integrations.trl_log import StepLog, check_trl_version
from oarctl.credit_rules import high_entropy_mask, token_credit
from oarctl.reshaping import concentration_metrics
from oarctl.schema import AttributeConfig, Config, ReshapeConfig

check_trl_version()

from trl import GRPOTrainer  # noqa: E402  (after the version check: a clear error beats a broken import)
from trl.models import unwrap_model_for_generation  # noqa: E402

# Options the trainer owns: TRL computes the sequence advantage; attribution uses TRL's model as it is.
TRL_OWNED = {"estimator": "the sequence advantage is TRL's GRPO advantage",
             "scale": "set GRPOConfig.scale_rewards", "eps": "TRL's advantage adds 1e-4 to the std",
             "accelerate_config": "launch the whole trainer with `accelerate launch`",
             "dtype": "attribution runs in the dtype of the model TRL trains"}


# Methods whose credit TRL's loss applies itself (no scores, weights 1 in the advantages).
LOSS_TIME_METHODS = ("entropy_mask",)


def oar_config(attribution) -> Config:
    """An oarctl Config whose attribute / reshape sections hold `attribution`: a method name, or a dict of
    attribute / reshape options (`method`, `oar_g_mode`, `quantile`, ... or `reshape.beta`). Validated
    like a config file; a bad option is a one-line OarError naming it."""
    if not isinstance(attribution, (str, dict)):
        raise OarError(f"attribution: expected a method name or a dict of options, got {type(attribution).__name__}")
    config = Config()
    options = {"method": attribution} if isinstance(attribution, str) else attribution
    for name, value in options.items():
        section, key = _section_of(str(name))
        set_option(config, section, key, value, "attribution")
    validate(config)
    return config


def _section_of(name: str) -> tuple[str, str]:
    section, dot, key = name.rpartition(".")
    if key in TRL_OWNED:
        raise OarError(f"attribution: option {name!r} is not used with TRL ({TRL_OWNED[key]})")
    if dot and section not in ("attribute", "reshape"):
        raise OarError(f"attribution: option {name!r}: only attribute.* and reshape.* options apply (the rest is "
                       f"TRL's GRPOConfig)")
    if dot:
        return section, key
    for section, cls in (("attribute", AttributeConfig), ("reshape", ReshapeConfig)):
        if key in {f.name for f in dataclasses.fields(cls)}:
            return section, key
    known = [f.name for f in dataclasses.fields(AttributeConfig) + dataclasses.fields(ReshapeConfig)]
    raise OarError(f"attribution: unknown option {name!r}; options: "
                   f"{', '.join(option for option in known if option not in TRL_OWNED)}")


@dataclass
class _LivePolicy:
    """The trainer's current model in the shape attribution methods load a policy (`load()`). The model is
    prepared on the first `load()`: methods that need none (uniform, random) never unwrap or gather it."""
    prepare: Callable[[], object]
    tokenizer: object
    model: object = None

    def load(self):
        if self.model is None:
            self.model = self.prepare()
        return self.model, self.tokenizer

    def load_tokenizer(self):
        return self.tokenizer


class OARGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with OAR token advantages. `attribution`: an oarctl method name or a dict of attribute /
    reshape options (see `oar_config`); `oar_log_dir`: write oarctl's advantages artifact per step."""

    def __init__(self, *args, attribution="oar_g", oar_log_dir: str | None = None, attribution_params: str = "sharded",
                 **kwargs):
        _refuse_options(kwargs)
        oar = oar_config(attribution)  # a bad option fails before TRL loads the model
        if attribution_params not in ("sharded", "gathered"):
            raise OarError(f"attribution_params: expected 'sharded' or 'gathered', got {attribution_params!r}")
        self.attribution_params = attribution_params
        quiet_deepspeed_without_gpus()  # TRL unwraps the model for generation: accelerate then imports DeepSpeed
        super().__init__(*args, **kwargs)
        if oar.attribute.method in LOSS_TIME_METHODS:
            self._mask_in_loss(oar)
        oar.run.seed = self.args.seed  # seeds OAR-G's noise, as run.seed does in `oarctl run`
        self.oar = oar
        self._refuse_setup()
        self.oar_log = StepLog(oar_log_dir, self.oar, self) if oar_log_dir else None
        self._oar_batch: dict = {}

    def _refuse_setup(self) -> None:
        if self._is_vlm:
            raise OarError("processing_class: OARGRPOTrainer attributes text-only models (the attribution "
                           "forward passes feed token ids, no images)")
        if self.is_fsdp_enabled and self.accelerator.state.fsdp_plugin.fsdp_version != 1 and \
                self.attribution_params == "gathered":
            raise OarError("attribution_params: 'gathered' needs FSDP1 (fsdp_version: 1); under FSDP2 attribution "
                           "runs on the shards ('sharded')")
        method = self.oar.attribute.method
        if self._call_sync() is not None and method not in SYNCED_METHODS:
            raise OarError(f"attribute.method: {method!r} does not pad its calls on sharded weights; use one of "
                           f"{', '.join(SYNCED_METHODS)}, or attribution_params='gathered'")

    def _mask_in_loss(self, oar: Config) -> None:
        """entropy_mask: TRL's loss applies the mask (`get_high_entropy_mask` below) at oarctl's quantile."""
        if self.args.top_entropy_quantile != 1.0:
            raise OarError("top_entropy_quantile: set the entropy mask's share once, as attribution option "
                           "'top_entropy_quantile' (GRPOConfig.top_entropy_quantile stays 1.0)")
        self.top_entropy_quantile = oar.reshape.top_entropy_quantile

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """oarctl's mask (TRL's rule) over every process's valid tokens; TRL calls it in each loss forward."""
        return high_entropy_mask(entropies, mask, threshold, self._gathered_values)

    def _gathered_values(self, local: torch.Tensor) -> torch.Tensor:
        """Every process's 1-D values (lengths differ; a negative sentinel pads them, entropies are >= 0)."""
        if self.accelerator.num_processes == 1:
            return local
        padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=-1e9)
        gathered = self.accelerator.gather(padded)
        return gathered[gathered != -1e9]

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        keep_trainer_fsdp_on_cpu(self)

    def _zero3(self) -> bool:
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        return plugin is not None and plugin.zero_stage == 3

    def _call_sync(self) -> CallSync | None:
        """A CallSync when attribution runs on sharded weights (its forwards are collective), else None."""
        if self.attribution_params == "sharded" and (self.is_fsdp_enabled or self._zero3()):
            return CallSync(self.accelerator.device)
        return None

    # ---- capture what TRL computes, then replace the advantages ----------------------------------

    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        self._oar_batch.update(prompt_ids=result[0], completion_ids=result[1], prompts=prompts)
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        total = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)  # TRL gives them advantage 0
        self._oar_batch["rewards"] = total.masked_fill(unscorable, 0.0).tolist()  # every process's rows
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._oar_batch = {}
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        started = time.perf_counter()
        batch = self._local_batch(inputs, output["advantages"])
        output["advantages"] = self._token_advantages(batch, output["completion_ids"].shape[1])
        seconds = self._slowest(time.perf_counter() - started)
        self._metrics[mode]["oar/attribution_seconds"].append(seconds)
        rows = self._gather_rows(batch, output, artifact=self.oar_log is not None and mode == "train")
        for name, value in concentration_metrics([r["reasoning_weights"] for r in rows],
                                                 np.array([r["advantage"] for r in rows])).items():
            self._metrics[mode][f"oar/{name}"].append(value)
        if self.oar_log is not None and mode == "train" and rank() == 0:
            self.oar_log.write(self.state.global_step, rows, seconds, self._metrics[mode])
        return output

    def log(self, logs: dict, start_time: float | None = None) -> None:
        super().log(logs, start_time)  # TRL adds its averaged metrics to `logs`
        if self.oar_log is not None and rank() == 0 and self.model.training:
            self.oar_log.add_update_metrics(logs)

    # ---- the OAR computation on this process's rows ----------------------------------------------

    def _local_batch(self, inputs, advantages: torch.Tensor) -> dict:
        """This process's rows as an oarctl table (rows keep their index in the global batch)."""
        captured = self._oar_batch
        count = len(captured["completion_ids"])
        offset = rank() * count  # TRL's process_slice
        rewards = captured["rewards"]
        global_rows = range(offset, offset + count)
        table = pa.table({
            "prompt_id": [self._group_id(row) for row in global_rows],
            "prompt_token_ids": pa.array(captured["prompt_ids"], pa.list_(pa.int32())),
            "response_token_ids": pa.array(captured["completion_ids"], pa.list_(pa.int32())),
            "temperature": pa.array([float(self.temperature)] * count, pa.float32()),
            "reward": pa.array(rewards[offset:offset + count], pa.float32())})
        rollouts = [dataclasses.replace(r, row=offset + r.row) for r in segment_rows(table, self.processing_class)]
        all_groups = [self._group_id(row) for row in range(len(rewards))]
        scored = [row - offset for row in rows_to_score(all_groups, rewards, self.oar.attribute.skip_uniform_groups)
                  if offset <= row < offset + count]
        return {"table": table, "rollouts": rollouts, "scored": scored, "advantages": advantages,
                "inputs": inputs, "offset": offset}

    def _group_id(self, global_row: int) -> str:
        """TRL's groups: `num_generations` (in evaluation `num_generations_eval`) consecutive rows of the
        global batch share a prompt."""
        size = self.num_generations if self.model.training else self.num_generations_eval
        return f"step{self.state.global_step:06d}-group{global_row // size:05d}"

    def _token_advantages(self, batch: dict, width: int) -> torch.Tensor:
        """(B, width) advantages under the method's credit rule (TRL's sequence advantage x Bi-Level weight by
        default), aligned with completion_ids."""
        scores = self._scores(batch)
        advantages = batch["advantages"]
        token = advantages.unsqueeze(1).expand(-1, width).clone()  # padding keeps A_i; the mask drops it
        rows = [(row_scores, rollout.segments.reasoning) for rollout, row_scores in zip(batch["rollouts"], scores)]
        method = self.oar.attribute.method
        if method in LOSS_TIME_METHODS:  # weights 1 here; TRL's loss masks (get_high_entropy_mask)
            method = "uniform"
        weights, per_token = token_credit(method, rows, advantages.float().cpu().numpy(), self.oar.reshape)
        batch["scores"], batch["weights"] = scores, weights
        for index, (row_weights, row_advantages) in enumerate(zip(weights, per_token)):
            if method == "ktae":  # additive: A_i + k_it
                token[index, :len(row_advantages)] = torch.as_tensor(row_advantages, device=token.device)
            else:  # A_i x w in TRL's dtype, as before the rules existed
                token[index, :len(row_weights)] = advantages[index] * torch.as_tensor(row_weights, device=token.device)
        return token

    def _scores(self, batch: dict) -> list[np.ndarray]:
        """Raw scores per response token; rows not scored (skip_uniform_groups) are NaN: weight 1."""
        rollouts, scored = batch["rollouts"], batch["scored"]
        scores = [np.full(r.response_length, np.nan, dtype=np.float32) for r in rollouts]
        sync = self._call_sync()
        if (not scored and sync is None) or self.oar.attribute.method in LOSS_TIME_METHODS:
            return scores  # on sharded weights a process without rows still pads its calls
        method = ATTRIBUTION_METHODS.get(self.oar.attribute.method)
        with contextlib.ExitStack() as stack:
            policy = _LivePolicy(lambda: stack.enter_context(self._attribution_model()), self.processing_class)
            context = StageContext(seed=self.args.seed, step=self.state.global_step, policy=policy, call_sync=sync)
            table = batch["table"].take(pa.array(scored, pa.int64()))  # typed: `scored` may be empty
            for row, values in zip(scored, method([rollouts[i] for i in scored], table, self.oar.attribute, context)):
                scores[row] = np.asarray(values, dtype=np.float32)
        return scores

    @contextlib.contextmanager
    def _attribution_model(self):
        """The policy in eval mode and in its weights' dtype; methods take gradients only with respect to
        embeddings (torch.autograd.grad)."""
        with self._unwrapped_for_attribution() as model:
            was_training = model.training
            model.eval()
            try:
                with _without_autocast(self.accelerator.unwrap_model(model)):
                    yield model
            finally:
                model.train(was_training)

    @contextlib.contextmanager
    def _unwrapped_for_attribution(self):
        """FSDP sharded: the FSDP root (FSDP2: the model itself), whose forwards gather the shards (padded
        calls); FSDP1 gathered: the plain model on full weights. Otherwise as TRL's own generation gets it (unwrapped; under ZeRO-3 the
        weights gathered with attribution_params="gathered", else gathered layer by layer in each call)."""
        if self.is_fsdp_enabled and self.attribution_params == "sharded":
            yield self.model_wrapped
        elif self.is_fsdp_enabled:
            with fsdp_gathered(self.model_wrapped) as model:
                yield model
        else:
            with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                             gather_deepspeed3_params=self.attribution_params == "gathered",
                                             gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs
                                             ) as model:
                yield model

    def _slowest(self, seconds: float) -> float:
        """The step waits for the slowest process."""
        return self.accelerator.gather(torch.tensor([seconds], device=self.accelerator.device)).max().item()

    # ---- every process's rows, for metrics and artifacts -----------------------------------------

    def _gather_rows(self, batch: dict, output: dict, artifact: bool) -> list[dict]:
        """Every process's rows in global order: weights for the metrics, with `artifact` all the columns."""
        from accelerate.utils import gather_object

        logprobs = self._response_logprobs(output) if artifact else None
        rows = []
        for index, rollout in enumerate(batch["rollouts"]):
            weights = batch["weights"][index]
            start, end = rollout.segments.reasoning
            row = {"row": batch["offset"] + index, "advantage": float(batch["advantages"][index]),
                   "reasoning_weights": weights[start:end]}
            if logprobs is not None:
                row.update(self.oar_log.row_columns(batch, index, weights, logprobs[index]))
            rows.append(row)
        return sorted(gather_object(rows) if self.accelerator.num_processes > 1 else rows, key=lambda r: r["row"])

    def _response_logprobs(self, output: dict) -> list[list[float]]:
        """Per-token log-probs for the artifact: the sampler's (vLLM) or TRL's old ones, else one forward."""
        logprobs = output.get("sampling_per_token_logps", output.get("old_per_token_logps"))
        if logprobs is None:
            prompt_completion = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], torch.ones_like(output["completion_mask"])], dim=1)
            with torch.no_grad():
                logprobs, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, prompt_completion, mask, output["completion_ids"].shape[1],
                    batch_size=self.args.per_device_train_batch_size)
        lengths = [len(ids) for ids in self._oar_batch["completion_ids"]]
        return [torch.nan_to_num(values[:length].float(), nan=0.0).tolist()  # vLLM marks unscored tokens NaN
                for values, length in zip(logprobs, lengths)]


@contextlib.contextmanager
def _without_autocast(model):
    """accelerate's mixed precision (GRPOConfig bf16 / fp16) replaces `model.forward` by an autocast wrapper, an
    instance attribute. Attribution calls the class's forward instead, so it scores in the weights' dtype as
    `oarctl attribute` does: OAR-G's 1e-3 embedding noise is below bfloat16's resolution."""
    wrapper = model.__dict__.pop("forward", None)
    try:
        yield
    finally:
        if wrapper is not None:
            model.forward = wrapper


def keep_trainer_fsdp_on_cpu(trainer) -> None:
    """An FSDP launch without CUDA stays FSDP (gloo) instead of accelerate's DDP, as in oarctl's update: call at
    the end of `create_accelerator_and_postprocess` (OARGRPOTrainer does; a stock GRPOTrainer compared with it
    can too). Rank 0-only loading (fsdp_cpu_ram_efficient_loading) is a GPU feature: refused here."""
    if trainer.is_fsdp_enabled or not fsdp_requested() or torch.cuda.is_available():
        return
    if os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true":
        raise OarError("fsdp_cpu_ram_efficient_loading: set it false for FSDP without CUDA (every process reads the "
                       "policy; configs/accelerate/cpu-fsdp-2proc-trl.yaml)")
    if trainer.accelerator.mixed_precision != "no":
        raise OarError("bf16: FSDP without CUDA runs in fp32 only: set GRPOConfig(bf16=False, fp16=False)")
    keep_fsdp_on_cpu(trainer.accelerator)
    trainer.is_fsdp_enabled = True


def _refuse_options(kwargs: dict) -> None:
    for name in ("tools", "environment_factory"):
        if kwargs.get(name):
            raise OarError(f"{name}: OARGRPOTrainer does not support tool calls (tool outputs inside a completion "
                           f"have no reasoning / answer structure to attribute)")
