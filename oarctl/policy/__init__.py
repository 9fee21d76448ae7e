"""The policy seam: load a checkpoint, generate responses, score tokens.

`transformers_backend` is the reference implementation; a vLLM backend plugs in beside it with the
same `generate` contract (response token ids, per-token log-probs of the sampling policy, finish
reason).
"""
