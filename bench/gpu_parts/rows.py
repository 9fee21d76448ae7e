"""The table bench/gpu_check.py prints: one row a stage (name, seconds, peak GiB), with its notes."""
from __future__ import annotations


def note(name: str, seconds: float, metrics: dict) -> str:
    if name.endswith("sample"):
        tokens = metrics["responses"] * metrics["response_length_mean"]
        return f"{tokens:.0f} tokens, {tokens / seconds:.0f} tokens/s" + _engine_note(metrics)
    if "verdict" in metrics:
        return ("" if metrics["ok"] else "FAILED: ") + metrics["verdict"]
    if name.endswith("update") and "checkpoint_write_seconds" in metrics:
        return (f"checkpoint written in {metrics['checkpoint_write_seconds']:.1f} s, hashed in "
                f"{metrics['checkpoint_hash_seconds']:.1f} s ({metrics['checkpoint_bytes_written'] / 2**30:.2f} GiB)")
    if name.startswith("update_persistent"):
        return ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                         for key, value in metrics.items())
    if name.startswith("update_fsdp"):
        io = ", ".join(f"{key} {metrics[key]}" for key in metrics if key.endswith("_seconds"))
        return (f"accelerate launch; weights differ from the in-process update by {metrics['weight_difference']:.2e}; "
                f"{metrics.get('weight_files', '?')} weight files written by the ranks in turn; {io}")
    if "agreement" in metrics:
        return metrics["agreement"]
    if "trl" in metrics:
        return metrics["trl"]
    if "responses" in metrics:
        return f"{metrics['responses']} responses, {seconds / metrics['responses']:.2f} s each"
    return ""


def _engine_note(metrics: dict) -> str:
    """The vLLM sample's engine: how it was obtained, its load and canary seconds ('' without vLLM)."""
    if "engine" not in metrics:
        return ""
    note = (f"; engine {metrics['engine']} ({metrics['engine_load_seconds']:.1f} s), "
            f"canary {metrics['canary_seconds']:.2f} s")
    return note + (f", {metrics['canary_failures']} canary failure(s)" if metrics["canary_failures"] else "")


def print_rows(rows) -> None:
    for name, seconds, peak, metrics in rows:
        print(f"{name:<40} {seconds:>8.1f} {peak:>9.2f}  {note(name, seconds, metrics)}", flush=True)
