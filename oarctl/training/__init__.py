"""Training machinery of the update stage, below the stage itself: setup.py (load, prepare, AdamW, the state a
persistent worker keeps) and save.py (gathered weights, weight files, training state, the checkpoint write).
The PPO loop is oarctl/stages/update.py."""
