"""One config's predictions, printed: its stages, every attribution method with its knobs, the
checkpoint I/O, the model shapes and assumptions at the top of a run, and the criteria's verdicts."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oarctl.config import Config

from bench.scaling.assumptions import fragmentation, io_rates
from bench.scaling.attribute import attribute_stage
from bench.scaling.checkpoint_io import print_checkpoint_io
from bench.scaling.formulas import (activation_bytes_per_token_layer, checkpoint_bytes_per_token_layer,
                                    forward_flops, kv_bytes_per_token, parameters, update_logits_bytes_per_token)
from bench.scaling.lengths import Lengths
from bench.scaling.model import GB, METHODS, OAR_P_FAMILY, SHAPES, Hardware
from bench.scaling.setting import Setting, accelerate_kind, accelerate_processes
from bench.scaling.stages import sample_stage, update_stage


def _gb(value: float) -> str:
    return f"{value / GB:7.1f}"


def _fmt_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


@dataclass
class Report:
    setting: Setting
    stages: dict
    methods: dict
    fits: dict
    every_group: dict  # method -> seconds when every group is scored (for the mixed-fraction break-even)


def resident_update_bytes(setting: Setting, hw: Hardware) -> float:
    """Per GPU, what a persistent FSDP update worker (update.persistent) keeps between steps, beside the
    engines and the attribute stage: its shard of the fp32 weights and of AdamW's two moments, 12 P / G
    (the gradients are freed after each step)."""
    cfg = setting.config
    if not (cfg.update.persistent and accelerate_kind(cfg.update.accelerate_config) == "fsdp"):
        return 0.0
    return 12 * parameters(setting.shape) / accelerate_processes(cfg.update.accelerate_config, hw.gpus)


def evaluate_setting(setting: Setting, hw: Hardware) -> Report:
    method = setting.config.attribute.method
    methods = {m: attribute_stage(setting, hw, m) for m in METHODS}
    stages = {"sample": sample_stage(setting, hw), f"attribute ({method})": methods[method], "update": update_stage(setting, hw)}
    resident = resident_update_bytes(setting, hw)
    for cost in [stages["sample"], *methods.values()]:
        if resident and cost.held_bytes:  # a stage that holds nothing (uniform) does not run
            cost.hold(update_resident=resident)
    limit = hw.memory_gb * GB
    fits = {name: cost.held_bytes <= limit and cost.vllm_fits for name, cost in stages.items()}
    every_group = {}
    if setting.config.attribute.skip_uniform_groups:
        everyone = Setting(setting.path, setting.shape, setting.config, setting.lengths, 1.0)
        every_group = {m: attribute_stage(everyone, hw, m).seconds for m in ("oar_g", "oar_p_span", "oar_p_screened")}
    return Report(setting, stages, methods, fits, every_group)


def print_report(report: Report, hw: Hardware, check: bool) -> list[str]:
    """One config's predictions, printed; its criteria's verdict lines (none unless `check`)."""
    setting, stages = report.setting, report.stages
    _print_knobs(setting, hw)
    total, attribute, rest = _print_stages(report)
    compute = {name.split()[0]: cost.seconds for name, cost in stages.items()}  # sample, attribute, update
    io_verdict = print_checkpoint_io(setting, hw, *io_rates(), compute)
    update = stages["update"]
    print(f"   update's vocabulary-projection term (predicted): {update.held.get('logits_chunk', 0) / GB:.1f} GB/GPU "
          f"({update_logits_bytes_per_token(setting.shape) / 1e6:.2f} MB per projected position, "
          f"update.logit_chunk_tokens {setting.config.update.logit_chunk_tokens})")
    _print_methods(report, hw, rest)
    if not check:
        return []
    return _verdicts(report, hw, total, attribute, rest) + [io_verdict]


def _print_knobs(setting: Setting, hw: Hardware) -> None:
    """The config's title line and its attribute and update knobs."""
    cfg, a = setting.config, setting.config.attribute
    print(f"\n== {setting.path}: {setting.shape.name}, attribute.method {a.method}, {hw.gpus}x "
          f"{hw.memory_gb:.0f} GB ==")
    print(f"   attribute: dtype {a.dtype}, accelerate_config {a.accelerate_config or '(none: one GPU)'}, "
          f"max_batch_tokens {a.max_batch_tokens}, batch_size {a.batch_size}, checkpointing {a.gradient_checkpointing}, "
          f"chunk_size {a.chunk_size}, span_tokens {a.span_tokens} ({a.span_spread}), max_perturbations "
          f"{a.max_perturbations}, screen/audit {a.screen_fraction}/{a.audit_fraction}, skip_uniform_groups "
          f"{a.skip_uniform_groups}" + (f" (assumed mixed-group fraction {setting.mixed_fraction})" if a.skip_uniform_groups else ""))
    u = cfg.update
    print(f"   update: {u.accelerate_config or '(one process)'}, micro_batch_tokens {u.micro_batch_tokens}, "
          f"micro_batch_size {u.micro_batch_size}, mini_batch_size {u.mini_batch_size}, bf16 {u.bf16}, "
          f"checkpointing {u.gradient_checkpointing}")


def _print_stages(report: Report) -> tuple[float, float, float]:
    """The stages' table and the predicted step; (step, attribute, rest of the step) seconds."""
    stages = report.stages
    total = sum(c.seconds for c in stages.values())
    print(f"   {'stage (predicted)':<26}{'PFLOP':>9}{'HBM TB moved':>14}{'held GB/GPU':>13}  fits  {'predicted s':>12}{'share':>7}")
    for name, cost in stages.items():
        print(f"   {name:<26}{cost.flops / 1e15:9.1f}{cost.hbm_bytes / 1e12:14.1f}{_gb(cost.held_bytes):>13}  "
              f"{'yes ' if report.fits[name] else 'NO  '}  {cost.seconds:12.1f}{100 * cost.seconds / total:6.1f}%")
        terms = ", ".join(f"{k} {v / GB:.1f}" for k, v in cost.held.items() if v)
        print(f"      {cost.note}; held (GB): {terms}")
    attribute_name = next(n for n in stages if n.startswith("attribute"))
    attribute = stages[attribute_name].seconds
    rest = total - attribute
    print(f"   predicted step: {total:.1f} s; attribute / (rest of the step) = {attribute / rest:.3f}"
          f" (rest = sample + update = {rest:.1f} s)")
    return total, attribute, rest


COST_BAR = 0.2  # issue 38: credit worth >= 1.2x the samples pays for itself at <= 0.2x the rollout's seconds


def credit_over_rollout(report: Report) -> dict[str, float]:
    """Per method, the price of its credit: predicted attribute seconds / predicted sample seconds of the
    same step's rollouts, t_attribute(method) / t_sample."""
    rollout = report.stages["sample"].seconds
    return {name: cost.seconds / rollout for name, cost in report.methods.items()}


def _print_methods(report: Report, hw: Hardware, rest: float) -> None:
    """Every attribution method with the config's attribute knobs, its credit seconds against the rollout's."""
    rollout = report.stages["sample"].seconds
    prices = credit_over_rollout(report)
    print(f"   every method with this file's attribute knobs (predicted; * = the file's method):")
    print(f"   credit / rollout = t_attribute(method) / t_sample, t_sample = {rollout:.1f} s (prefill + decode of the "
          f"step's responses); each t a sum over kernels of max(FLOPs / peak, HBM bytes / bandwidth) / efficiency")
    print(f"   '<= {COST_BAR}x': within the cost half of issue 38's bar (the other half, an effective batch >= 1.2x, "
          f"is the gradient bench's to measure)")
    print(f"     {'method':<16}{'PFLOP':>9}{'held GB/GPU':>13}  fits  {'credit s':>10}  {'rollout s':>10}  "
          f"{'credit / rollout':>16}  {'x rest of step':>14}")
    for name, cost in report.methods.items():
        held = cost.held_bytes
        fit = "yes " if held <= hw.memory_gb * GB else "NO  "
        mark = "*" if name == report.setting.config.attribute.method else " "
        verdict = f"  <= {COST_BAR}x" if 0 < prices[name] <= COST_BAR else ""
        print(f"   {mark} {name:<16}{cost.flops / 1e15:9.1f}{_gb(held) if held else '      -':>13}  {fit if held else '    '}  "
              f"{_fmt_seconds(cost.seconds):>10}  {_fmt_seconds(rollout):>10}  {prices[name]:16.3f}  "
              f"{cost.seconds / rest:14.3f}{verdict}")


def _verdicts(report: Report, hw: Hardware, total: float, attribute: float, rest: float) -> list[str]:
    """The criteria (a) every stage fits, (b) OAR-G's share of the step, (c) the cheapest OAR-P variant."""
    setting, stages, a = report.setting, report.stages, report.setting.config.attribute
    lines = []
    tag = setting.path
    for name, ok in report.fits.items():
        cost = stages[name]
        lines.append(f"{'PASS' if ok else 'FAIL'} (a) {tag}: {name} fits in {hw.memory_gb:.0f} GB per GPU "
                     f"(predicted {cost.held_bytes / GB:.1f} GB)")
    if a.method == "oar_g":
        share = attribute / total
        lines.append(f"{'PASS' if share <= 0.10 else 'FAIL'} (b) {tag}: OAR-G attribute is {100 * share:.1f}% of the "
                     f"step (predicted {attribute:.1f} s of {total:.1f} s; limit 10%)" + _break_even(report, "oar_g", rest / 9))
    if a.method in OAR_P_FAMILY:
        cheap = {m: report.methods[m].seconds for m in ("oar_p_span", "oar_p_screened")}
        best = min(cheap, key=cheap.get)
        ratio = cheap[best] / rest
        lines.append(f"{'PASS' if ratio <= 1.0 else 'FAIL'} (c) {tag}: cheapest OAR-P variant {best} costs {ratio:.2f}x "
                     f"the rest of the step (predicted {cheap[best]:.1f} s vs {rest:.1f} s; limit 1x; "
                     f"{'oar_p_span' if best != 'oar_p_span' else 'oar_p_screened'} {max(cheap.values()) / rest:.2f}x)"
                     + _break_even(report, best, rest))
        if a.method != best:
            lines.append(f"FAIL (c) {tag}: attribute.method is {a.method}, not the cheapest variant {best}")
        exact = report.methods["oar_p"].seconds
        lines.append(f"INFO (c) {tag}: exact oar_p with these knobs: predicted {_fmt_seconds(exact)} per step "
                     f"({exact / rest:.1f}x the rest of the step)")
    return lines


def _break_even(report: Report, method: str, budget: float) -> str:
    """With skip_uniform_groups the attribute seconds scale with the mixed-group fraction m: the largest m
    within `budget` seconds, from the cost of scoring every group."""
    if method not in report.every_group:
        return ""
    return (f"; holds while the mixed-group fraction is <= {min(1.0, budget / report.every_group[method]):.2f} "
            f"(assumed {report.setting.mixed_fraction})")


def exact_oar_p_references(setting: Setting, hw: Hardware) -> list[str]:
    """Exact OAR-P at the issue's two settings: fp32 on one GPU, bf16 on every GPU; every group scored."""
    lines = []
    for dtype, accelerate, label in (("float32", "", "fp32, 1 GPU"), ("bfloat16", "configs/accelerate/ddp.yaml",
                                                                        f"bf16, {hw.gpus} GPUs")):
        config = Config()
        for section in ("sample", "vllm", "update"):
            setattr(config, section, getattr(setting.config, section))
        config.attribute = type(setting.config.attribute)(**{**vars(setting.config.attribute), "dtype": dtype,
                                                             "accelerate_config": accelerate,
                                                             "skip_uniform_groups": False, "method": "oar_p"})
        variant = Setting(setting.path, setting.shape, config, setting.lengths, setting.mixed_fraction)
        cost = attribute_stage(variant, hw, "oar_p")
        lines.append(f"INFO exact oar_p, {label}, every row, chunk_size {config.attribute.chunk_size}, max_batch_tokens "
                     f"{config.attribute.max_batch_tokens}: predicted {_fmt_seconds(cost.seconds)} per step, "
                     f"{cost.flops / 1e18:.2f} EFLOP (the issue estimated 21-45 h fp32 on one GPU, 16-30 min bf16 on 8)")
    return lines


def print_shapes(hw: Hardware, lengths: Lengths) -> None:
    print("Model shapes (built in; from each model's config.json):")
    print(f"  {'model':<14}{'H':>6}{'L':>4}{'heads':>6}{'kv':>4}{'I':>7}{'V':>8} tied  {'params':>7}  "
          f"{'fwd GFLOP/token':>15}  {'KV KB/token':>11}  {'kept KB/token/layer bf16 (ckpt)':>31}")
    for s in SHAPES.values():
        f = forward_flops(s, 1, 0, 1) / 1e9
        print(f"  {s.name:<14}{s.hidden:>6}{s.layers:>4}{s.heads:>6}{s.kv_heads:>4}{s.intermediate:>7}{s.vocab:>8} "
              f"{'yes ' if s.tied else 'no  '} {parameters(s) / 1e9:6.2f}B  {f:15.2f}  "
              f"{kv_bytes_per_token(s, 2) / 1024:11.1f}  {activation_bytes_per_token_layer(s, 2) / 1024:20.1f} "
              f"({checkpoint_bytes_per_token_layer(s, 2) / 1024:.1f})")
    print(f"Hardware (assumed): {hw.gpus}x GPU, {hw.tflops:g} dense bf16 TFLOPS ({hw.fp32_tflops:g} fp32), "
          f"{hw.memory_gb:g} GB, {hw.hbm_tbps:g} TB/s HBM, {hw.nvlink_gbps:g} GB/s NVLink per direction; "
          f"efficiency {hw.efficiency:g} of every peak, for every kernel of every stage; "
          f"{hw.overhead_gb:g} GB CUDA/NCCL overhead per process; allocator headroom x{fragmentation():g} on activations")
    R = lengths.responses
    print(f"Response lengths (assumed): min(X, {lengths.cap}), X lognormal, sigma {lengths.sigma:g}, scale so that "
          f"E[R] = {lengths.mean:.0f}; E[R^2] = {lengths.second:.3g} (sqrt {math.sqrt(lengths.second):.0f}); "
          f"P(R = {lengths.cap}) = {100 * lengths.at_cap:.2f}%; the {len(R)} representative lengths: mean {R.mean():.0f}, "
          f"median {int(np.median(R))}, max {R.max()}, {int((R == lengths.cap).sum())} at the cap; prompt "
          f"{lengths.prompt} tokens; groups of {lengths.group}")
