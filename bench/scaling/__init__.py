"""The 7B arithmetic behind bench/scale.py (the command; its docstring says what a prediction assumes),
one topic a module, from the bottom up:

    model.py           model shapes (from each model's config.json), the hardware, the token constants
    formulas.py        the formulas: FLOPs, bytes moved and bytes held, each with its formula in its docstring
    assumptions.py     the allocator headroom (calibrated) and the checkpoint disk / sha256 rates of a run
    lengths.py         the response-length distribution (a censored lognormal at its quantiles)
    batching_rules.py  the code's own batching rules, mirrored (tests/test_scale.py checks them against oarctl)
    cost.py            cost bookkeeping: work, seconds of the slowest GPU, bytes held per GPU by term
    setting.py         a config file reduced to what the arithmetic reads (and `--set` overrides)
    stages.py          the sample and update stages' costs
    attribute.py       the attribute stage's cost, per attribution method
    checkpoint_io.py   the checkpoint traffic on one step's critical path
    report.py          one config's predictions, printed, and the criteria's verdicts
    measured.py        the predictions beside a bench/gpu_check.py measurement; OARGRPOTrainer's weight memory
    calibration.py     the CPU calibration (torch): measured vs predicted FLOPs and kept bytes on a tiny Qwen2

Nothing here imports torch at module level: only calibration.py's functions do.
"""
