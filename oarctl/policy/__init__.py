"""The policy seam: load a checkpoint, generate responses, score tokens.

`transformers_backend` is the reference implementation; `vllm_backend` has the same `generate`
contract (response token ids, per-token log-probs of the sampling policy, finish reason);
`backends` is the registry the stages call (`policy.backend`: transformers, vllm, auto).
"""
