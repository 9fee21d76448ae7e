"""The 7B arithmetic: FLOPs, bytes moved, bytes held per GPU and predicted seconds of every stage of
one RL step, for the shipped real-size configs (issue 14). Nothing here runs on a GPU: every number
printed for a GPU is a prediction from the formulas below, and is labelled so.

    python bench/scale.py                       # every configs/qwen2.5-*/*.yaml: the arithmetic, no torch, seconds
    python bench/scale.py --calibrate           # + the CPU calibration (torch, transformers: ~30-60 s on 2 cores)
    python bench/scale.py --quick               # the arithmetic only, never the calibration (for tests)
    python bench/scale.py --config FILE.yaml [--shape 7b|1.5b] [--gpus 8 --tflops 989 --memory-gb 80 ...]
    python bench/scale.py --set attribute.max_batch_tokens=8192 ...   # what-if: override options in every file

What a prediction assumes (all printed at the top of a run):
- the model shape follows from policy.path's name (Qwen2.5[-Math]-7B or -1.5B), or --shape;
- one step = prompts_per_step x group_size responses; prompts of --prompt-tokens tokens; response
  lengths R = min(X, max_new_tokens), X lognormal with shape --sigma and its scale solved so that
  E[R] = --mean-response (a censored lognormal: responses that hit the cap stay at the cap). The
  distribution is evaluated at the n quantiles (i + 1/2) / n, shuffled (seed 0) into groups: exact
  moments, and groups as mixed in length as independent draws (real groups are more alike, so
  padding is overestimated a little);
- a response is reasoning + 4 conclude + 4 answer + 2 closing tokens (answer_mean: 4 outcome
  positions, last: 1);
- every kernel (a forward pass, a decode step, a micro-batch) takes max(FLOPs / peak, HBM bytes /
  bandwidth, NVLink bytes / link bandwidth) / efficiency: one --efficiency for every stage;
- engine starts, model loads, verification and the checkpoint write (~90 GB per step) are not in
  the seconds: they add to every stage but attribute, so the attribute shares printed are upper bounds.

Beside every attribution method, its price: credit / rollout = t_attribute(method) / t_sample, the
predicted seconds of its credit over those of sampling the step's responses (the formula is printed
with it; issue 38's bar for credit that pays for itself is <= 0.2x).

The formulas are the small functions of bench/scaling/formulas.py, each with its formula in its
docstring. --calibrate (bench/scaling/calibration.py) checks two of them on CPU against a random-init
Qwen2 of the 7B's proportions scaled down: the forward FLOPs (torch's FlopCounterMode) and the bytes
per token per layer that OAR-G's backward keeps (saved-tensor hooks, without and with gradient
checkpointing).

This file is the command; the arithmetic lives in bench/scaling/, one module a topic (its __init__.py
lists them): model shapes and hardware in model.py, the stages' costs in stages.py and attribute.py,
the checkpoint I/O in checkpoint_io.py, the printed report in report.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scaling import assumptions  # noqa: E402  (the arithmetic, by topic: bench/scaling/__init__.py)
from bench.scaling.calibration import calibrate  # noqa: E402  (imports torch only when called)
from bench.scaling.measured import against_measured, print_trl_memory  # noqa: E402
from bench.scaling.model import OAR_P_FAMILY, SHAPES, Hardware  # noqa: E402
from bench.scaling.report import evaluate_setting, exact_oar_p_references, print_report, print_shapes  # noqa: E402
from bench.scaling.setting import load_setting  # noqa: E402


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", type=Path, help="config YAML (repeatable; default: "
                        "every configs/qwen2.5-*/*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                        help="override a config option in every file, as `oarctl --set` does (what-if runs)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="model shape (default: from policy.path's name)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak TFLOPS per GPU (H100 SXM)")
    parser.add_argument("--fp32-tflops", type=float, default=67.0, help="fp32 peak (no TF32: PyTorch's default)")
    parser.add_argument("--memory-gb", type=float, default=80.0)
    parser.add_argument("--hbm-tbps", type=float, default=3.35)
    parser.add_argument("--nvlink-gbps", type=float, default=450.0)
    parser.add_argument("--efficiency", "--mfu", type=float, default=0.4, dest="efficiency",
                        help="share of every peak (FLOPS, HBM, NVLink) every kernel reaches, all stages alike")
    parser.add_argument("--overhead-gb", type=float, default=3.0)
    parser.add_argument("--fragmentation", type=float, default=1.25, help="allocator headroom on activations")
    parser.add_argument("--prompt-tokens", type=int, default=150)
    parser.add_argument("--mean-response", type=float, default=700.0)
    parser.add_argument("--sigma", type=float, default=0.75, help="lognormal shape of the response lengths")
    parser.add_argument("--mixed-fraction", type=float, default=0.5,
                        help="assumed share of groups with mixed rewards (what skip_uniform_groups scores)")
    parser.add_argument("--quick", action="store_true", help="never calibrate (no torch import), even with --calibrate")
    parser.add_argument("--disk-gbps", type=float, default=3.0, help="checkpoint disk read/write GB/s")
    parser.add_argument("--hash-gbps", type=float, default=1.07,
                        help="sha256 GB/s per thread (1.07 measured on one core of the development machine)")
    parser.add_argument("--measured", type=Path, metavar="LOG",
                        help="a bench/gpu_check.py output: its long attribute rows beside this arithmetic's "
                             "prediction for one GPU (use --tflops/--hbm-tbps of that GPU)")
    parser.add_argument("--measured-lengths", type=int, nargs=2, default=[12, 2036], metavar=("PROMPT", "RESPONSE"),
                        help="prompt and response tokens of gpu_check's long rows")
    parser.add_argument("--trl", action="store_true", help="only OARGRPOTrainer's weight memory per GPU while it "
                                                          "attributes, per mode (--shape, default 7b; --gpus)")
    parser.add_argument("--calibrate", action="store_true",
                        help="also run the CPU calibration (~30-60 s): measured vs predicted FLOPs and kept bytes")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    assumptions.configure(args.fragmentation, args.disk_gbps, args.hash_gbps)
    hw = Hardware(args.gpus, args.tflops, args.fp32_tflops, args.memory_gb, args.hbm_tbps, args.nvlink_gbps,
                  args.efficiency, args.overhead_gb)
    if args.trl:
        print_trl_memory(SHAPES[args.shape or "7b"], args.gpus)
        return 0
    if args.measured:
        print(f"bench/scale.py against {args.measured} (measured there; predicted here for 1 GPU of "
              f"{args.tflops:.0f} bf16 TFLOPS, {args.hbm_tbps} TB/s at efficiency {args.efficiency}; 'reached': "
              f"the efficiency the measurement implies)")
        for line in against_measured(args.measured, hw, *args.measured_lengths):
            print(f"  {line}")
        return 0
    paths = args.config or sorted(ROOT.glob("configs/qwen2.5-*/*.yaml"))
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        print(f"error: --config {missing[0]}: file not found", file=sys.stderr)
        return 2
    shape = SHAPES[args.shape] if args.shape else None
    settings = [load_setting(p.resolve(), shape, args, args.mixed_fraction, args.overrides) for p in paths]
    print("bench/scale.py: the arithmetic of one RL step; every GPU number below is PREDICTED (not run on a GPU)")
    print_shapes(hw, settings[0].lengths)
    if args.calibrate and not args.quick:
        print("\nCalibration on this CPU (measured vs predicted by the formulas above):")
        for line in calibrate():
            print(f"  {line}")
    verdicts = []
    for setting in settings:
        check = setting.shape == SHAPES["7b"] and hw.memory_gb == 80 and hw.gpus == 8
        verdicts += print_report(evaluate_setting(setting, hw), hw, check)
    references = [s for s in settings if s.config.attribute.method in OAR_P_FAMILY]
    if references:
        verdicts += exact_oar_p_references(references[0], hw)
    print("\nCriteria (8x 80 GB, the 7B configs; predicted):")
    for line in verdicts:
        print(f"  {line}")
    if not any(s.shape == SHAPES["7b"] for s in settings) or hw.gpus != 8 or hw.memory_gb != 80:
        print("  (criteria are checked for 7B shapes on 8x 80 GB only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
