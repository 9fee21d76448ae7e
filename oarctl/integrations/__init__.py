"""oarctl inside other trainers: `oarctl.integrations.trl.OARGRPOTrainer` (pip install 'oarctl[trl]')."""
