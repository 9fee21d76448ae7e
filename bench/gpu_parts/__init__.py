"""The parts of bench/gpu_check.py (the command; its docstring says what each part measures), one module each:

    common.py   what every part uses: the config overrides, a stage run in this process timed with its peak
                GPU memory (one row), the FSDP launcher, the weight difference of two checkpoints
    step.py     part step: one sampled RL step, then the update under `accelerate launch` and through a
                persistent worker
    long.py     part long: long-response attribution by every method, then reshape and the update
    twostep.py  part twostep: two RL steps in a row, the vLLM engine kept between them
    trl.py      part trl: examples/trl_oar.py (OARGRPOTrainer) under accelerate
    rows.py     the printed table: one row a stage, its notes

Nothing here imports torch, transformers or oarctl at module level (bench/scale.py reads long.py's knobs).
A row is (name, seconds, peak GiB, metrics).
"""
