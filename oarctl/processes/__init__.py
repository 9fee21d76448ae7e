"""Processes and the GPUs they share: `gpus` (the hand-off between engines and launched stages),
`launch` (stages under `accelerate launch`, the persistent update worker) and `update_worker` (its ranks'
loop). Only this package starts stage processes and keeps hand-off state."""
