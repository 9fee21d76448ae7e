"""Every artifact's schema, in one place, with checked reads and atomic writes.

Token-level columns are list<int32> / list<float32> aligned with `response_token_ids`. Each artifact
extends the previous one (rollouts -> verified -> attributions -> advantages), so one row carries
everything known about a response and anyone can recompute a stage from its input file.
Extra columns are allowed in inputs (users add their own); missing or mistyped ones are errors.
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from oarctl.errors import OarError

TOKENS = pa.list_(pa.int32())
FLOATS = pa.list_(pa.float32())

PROMPTS = pa.schema([
    ("prompt_id", pa.string()),   # unique id of the problem
    ("problem", pa.string()),     # problem statement shown to the model
    ("answer", pa.string()),      # gold final answer, raw text
])
ROLLOUTS = pa.schema(list(PROMPTS) + [
    ("sample_index", pa.int32()),          # index of the response within its prompt's group
    ("prompt_token_ids", TOKENS),          # the chat-formatted prompt, as fed to the model
    ("response_token_ids", TOKENS),        # sampled tokens, final eos included when produced
    ("response_logprobs", FLOATS),         # log-prob of each sampled token under the sampling policy
    ("response_text", pa.string()),        # decoded response (special tokens removed)
    ("finish_reason", pa.string()),        # "stop" (eos) or "length"
    ("temperature", pa.float32()),         # temperature the log-probs were computed at
])
VERIFIED = pa.schema(list(ROLLOUTS) + [
    ("extracted_answer", pa.string()),     # null when no final answer was found
    ("reward", pa.float32()),              # 1.0 correct, 0.0 otherwise
    ("answer_char_start", pa.int32()),     # character span of the answer in response_text; -1 when none
    ("answer_char_end", pa.int32()),
    ("answer_token_start", pa.int32()),    # the same span in response_token_ids, half-open; -1 when none
    ("answer_token_end", pa.int32()),
    ("normalized_answer", pa.string()),    # the answer as compared (null when none)
    ("normalized_gold", pa.string()),      # the gold answer as compared
    ("verdict", pa.string()),              # correct, wrong, no_answer, timeout or error
    ("parse_ok", pa.bool_()),              # the answer (and gold) could be read
    ("timed_out", pa.bool_()),             # the symbolic check was killed at verify.timeout
    ("extraction", pa.string()),           # strict or lenient (verify.extraction); lenient+math-verify where
                                           # the second path (math-verify's own extraction) graded it
])
ATTRIBUTIONS = pa.schema(list(VERIFIED) + [
    ("attribution_method", pa.string()),   # registry name of the method that scored the tokens
    ("outcome_mode", pa.string()),         # outcome definition used (last for rows without answer)
    ("reasoning_start", pa.int32()),       # response-token spans, half-open [start, end)
    ("reasoning_end", pa.int32()),
    ("conclude_start", pa.int32()),        # the \boxed{ marker, or the probe when uses_probe
    ("conclude_end", pa.int32()),
    ("answer_start", pa.int32()),          # the rollout's own extracted answer tokens
    ("answer_end", pa.int32()),
    ("uses_probe", pa.bool_()),            # no answer found: the probe text was appended
    ("token_scores", FLOATS),              # raw score per response token; NaN outside the reasoning
])
ADVANTAGES = pa.schema(list(ATTRIBUTIONS) + [
    ("advantage", pa.float32()),           # sequence-level (GRPO) advantage
    ("token_weights", FLOATS),             # reshaping weight of each response token (1 = GRPO)
    ("token_advantages", FLOATS),          # advantage * weight, what the update stage optimises
])
UPDATE_LOG = pa.schema([
    ("optimizer_step", pa.int32()),        # index of the optimizer step within this update
    ("epoch", pa.int32()),                 # pass over the batch (update.epochs)
    ("loss", pa.float32()),                # what is minimised: pg_loss plus update.kl_coef x kl
    ("pg_loss", pa.float32()),             # the clipped surrogate, aggregated by update.loss_aggregation
    ("clip_fraction", pa.float32()),       # share of response tokens whose probability ratio was clipped
    ("kl", pa.float32()),                  # k3 KL to the initial policy (0 when update.kl_coef is 0)
    ("entropy", pa.float32()),             # mean entropy of the sampling distribution at the response tokens
    ("grad_norm", pa.float32()),           # gradient norm before clipping at update.max_grad_norm
    ("ratio_mean", pa.float32()),          # mean probability ratio, new policy / sampling policy
    ("tokens", pa.int32()),                # response tokens in the optimizer step
])
EVAL_RESULTS = pa.schema(list(PROMPTS) + [
    ("benchmark", pa.string()),            # evaluate.benchmarks name, or "heldout"
    ("mode", pa.string()),                 # "greedy" or "sampled"
    ("sample_index", pa.int32()),
    ("response_token_ids", TOKENS),
    ("response_text", pa.string()),
    ("finish_reason", pa.string()),
    ("extracted_answer", pa.string()),
    ("normalized_answer", pa.string()),    # what maj@k votes on (null when no answer)
    ("verdict", pa.string()),              # correct, wrong, no_answer, timeout or error
    ("reward", pa.float32()),
    ("extraction", pa.string()),           # strict or lenient (evaluate.extraction); lenient+math-verify where
                                           # the second path (math-verify's own extraction) graded it
])

FIDELITY = pa.schema([                     # `oarctl fidelity`: one row per rollout x method x K
    ("source_row", pa.int32()),            # row of the rollout in the input file
    ("prompt_id", pa.string()),
    ("sample_index", pa.int32()),
    ("reward", pa.float32()),              # the rollout's reward, as verified
    ("method", pa.string()),               # attribution method (registry name)
    ("k_fraction", pa.float32()),          # K: share of the reasoning tokens selected
    ("top_k", pa.int32()),                 # tokens selected: ceil(K x reasoning_tokens), at least 1
    ("reasoning_tokens", pa.int32()),      # reasoning tokens of the rollout
    ("causal_tokens", pa.int32()),         # reasoning tokens whose replacement flips the verdict
    ("causal_positions", TOKENS),          # their response positions
    ("hits", pa.int32()),                  # causal tokens among the selected ones
    ("recall", pa.float32()),              # hits / causal_tokens; NaN when there is no causal token
])

GRADIENT_CHECK = pa.schema([               # `oarctl gradient-check`: one row per credit method
    ("method", pa.string()),               # attribution method (registry name); uniform first
    ("batches", pa.int32()),               # batches scored (both halves)
    ("cosine", pa.float64()),              # mean cos(batch gradient, reference: the other half's uniform gradient)
    ("cosine_low", pa.float64()),          # lower end of its 95% Student-t interval over the batches
    ("cosine_high", pa.float64()),         # upper end of that interval
    ("vs_uniform", pa.float64()),          # mean paired difference of cosines to uniform's, same batches
    ("vs_uniform_low", pa.float64()),      # lower end of its 95% interval
    ("vs_uniform_high", pa.float64()),     # upper end of that interval
    ("corrected_cosine", pa.float64()),    # cosine / cos(reference, true gradient): the reference's noise removed
    ("expected_cosine", pa.float64()),     # cos(the method's expected gradient, uniform's): ~1 where effective_batch holds
    ("grad_sq_norm", pa.float64()),        # mean squared norm of a batch gradient
    ("effective_batch", pa.float64()),     # (1/c_uniform^2 - 1) / (1/c^2 - 1), c corrected: uniform batches it is worth
    ("effective_batch_split", pa.float64()),  # the same, c = cosine / sqrt(cos(R_A, R_B)): the steadier with a weak signal
    ("seconds", pa.float64()),             # measured: the method's attribution + reshaping of the pool
    ("cost_vs_sampling", pa.float64()),    # seconds / the sample stage's seconds for the pool (NaN: unknown)
    ("pays", pa.bool_()),                  # effective_batch - 1 >= cost_vs_sampling (null: unknown)
])

SCHEMAS = {
    "prompts": PROMPTS, "rollouts": ROLLOUTS, "verified": VERIFIED, "attributions": ATTRIBUTIONS,
    "advantages": ADVANTAGES, "update_log": UPDATE_LOG, "eval_results": EVAL_RESULTS,
    "fidelity": FIDELITY, "gradient_check": GRADIENT_CHECK,
}
# Columns that only some artifacts carry; where present they are checked and kept by every later stage.
OPTIONAL = {
    "prompts": [("messages", pa.string())],  # chat-format prompts: the message list as JSON ("" for plain
                                             # text rows); sample and evaluate apply the chat template to it
    "rollouts": [("token_truth", pa.list_(pa.int8()))],  # chains toy family only: ground-truth credit label
}                                                         # per response token, 1 / 0 / -1 (oarctl/toy/truth.py)
for _later in ("verified", "attributions", "advantages"):
    OPTIONAL[_later] = OPTIONAL["rollouts"]
OPTIONAL["fidelity"] = [              # with token_truth in the input: each method against the labels
    ("truth_tokens", pa.int32()),     # label-1 reasoning tokens of the rollout
    ("truth_hits", pa.int32()),       # label-1 tokens among the selected top_k
    ("truth_recall", pa.float32()),   # truth_hits / truth_tokens; NaN when there is none
    ("truth_auc", pa.float32()),      # P(label-1 token outscores a label-0 one); NaN without both kinds
    ("query_tokens", pa.int32()),     # label-1 tokens of the query's own step (fidelity_truth.CLASSES)
    ("earlier_tokens", pa.int32()),   # label-1 tokens of the earlier chain
    ("free_tokens", pa.int32()),      # label-0 tokens
    ("truth_auc_query", pa.float32()),    # AUC of the query step's tokens against the free ones
    ("truth_auc_earlier", pa.float32()),  # AUC of the earlier chain's tokens against the free ones
    ("weight_query", pa.float32()),   # mean Bi-Level weight (configured reshape) of each class; NaN: none
    ("weight_earlier", pa.float32()),  # mean Bi-Level weight of the earlier chain's tokens; NaN: none
    ("weight_free", pa.float32()),     # mean Bi-Level weight of the free tokens; NaN: none
]
# Columns that must hold one value per response token.
ALIGNED_WITH_RESPONSE = ["response_logprobs", "token_scores", "token_weights", "token_advantages", "token_truth"]


def _open_parquet(path: Path) -> pa.Table:
    if not path.exists():
        raise OarError(f"{path}: file not found")
    if path.is_dir():
        raise OarError(f"{path}: is a directory, expected a Parquet file")
    if path.stat().st_size == 0:
        raise OarError(f"{path}: file is empty")
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise OarError(f"{path}: not a readable Parquet file ({str(error).splitlines()[0]})") from None


NULLABLE = {"extracted_answer", "outcome_mode", "normalized_answer", "normalized_gold"}


def _numeric_family(data_type) -> str | None:
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        inner = _numeric_family(data_type.value_type)
        return None if inner is None else "list of " + inner
    if pa.types.is_integer(data_type):
        return "integer"
    if pa.types.is_floating(data_type):
        return "number"
    return None


def _castable(actual, expected) -> bool:
    """Widening within numbers (int64 -> int32, double -> float32, int -> float) is fine; text is not."""
    if pa.types.is_string(expected) or pa.types.is_boolean(expected):
        return pa.types.is_large_string(actual) if pa.types.is_string(expected) else False
    actual_family, expected_family = _numeric_family(actual), _numeric_family(expected)
    if actual_family is None or expected_family is None:
        return False
    return actual_family == expected_family or (actual_family, expected_family) in {
        ("integer", "number"), ("list of integer", "list of number")}


def _check_nulls(table: pa.Table, path: Path, name: str) -> None:
    column = table[name]
    if name not in NULLABLE and column.null_count:
        row = column.is_null().to_pylist().index(True)
        raise OarError(f"{path}: row {row}: column {name!r} is null")
    if pa.types.is_list(column.type) and pc.list_flatten(column).null_count:
        row = next(i for i, values in enumerate(column.to_pylist()) if values and None in values)
        raise OarError(f"{path}: row {row}: column {name!r} holds a null value")


def _check_columns(table: pa.Table, schema: pa.Schema, path: Path, kind: str) -> pa.Table:
    for expected in schema:
        if expected.name not in table.column_names:
            raise OarError(f"{path}: missing column {expected.name!r} (expected a {kind} file)")
        actual = table.schema.field(expected.name).type
        if actual != expected.type and not _castable(actual, expected.type):
            raise OarError(f"{path}: column {expected.name!r} has type {actual}, expected {expected.type}")
        _check_nulls(table, path, expected.name)
        if actual != expected.type:
            try:
                table = table.set_column(table.column_names.index(expected.name), expected.name,
                                         table[expected.name].cast(expected.type, safe=True))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise OarError(f"{path}: column {expected.name!r} has type {actual}, "
                               f"expected {expected.type}") from None
    return table


# token_scores is NaN outside the reasoning by design; every other float must be finite.
NAN_ALLOWED = {"token_scores", "recall", "truth_recall", "truth_auc", "truth_auc_query", "truth_auc_earlier",
               "weight_query", "weight_earlier", "weight_free"}  # NaN: nothing to recall / to rank


def _check_finite(table: pa.Table, path: Path) -> None:
    """No NaN or infinite number in a float column (a NaN advantage would train NaN weights)."""
    for name in table.column_names:
        column = table[name]
        values = pc.list_flatten(column) if pa.types.is_list(column.type) else column
        if not pa.types.is_floating(values.type) or len(values) == 0:
            continue
        bad = pc.is_inf(values) if name in NAN_ALLOWED else pc.invert(pc.is_finite(values))
        if pc.any(bad).as_py():
            first = pc.index(bad, True).as_py()
            row = pc.list_parent_indices(column)[first].as_py() if pa.types.is_list(column.type) else first
            what = "an infinite" if name in NAN_ALLOWED else "a NaN or infinite"
            raise OarError(f"{path}: row {row}: column {name!r} holds {what} value")


def _check_alignment(table: pa.Table, path: Path) -> None:
    if "response_token_ids" not in table.column_names:
        return
    lengths = pc.list_value_length(table["response_token_ids"]).to_pylist()
    for column in ALIGNED_WITH_RESPONSE:
        if column not in table.column_names:
            continue
        for row, (want, got) in enumerate(zip(lengths, pc.list_value_length(table[column]).to_pylist())):
            if want != got:
                raise OarError(f"{path}: row {row}: column {column!r} has {got} values for {want} response tokens")


def read_artifact(path: str | Path, kind: str) -> pa.Table:
    """Read and check an artifact; any problem is a one-line OarError naming the file."""
    path = Path(path)
    table = _open_parquet(path)
    if table.num_rows == 0:
        raise OarError(f"{path}: has no rows")
    table = _check_columns(table, SCHEMAS[kind], path, kind)
    present = [field for field in OPTIONAL.get(kind, []) if field[0] in table.column_names]
    table = _check_columns(table, pa.schema(present), path, kind)
    _check_alignment(table, path)
    _check_finite(table.select([f.name for f in SCHEMAS[kind]]), path)
    return table


def make_table(columns: dict, kind: str) -> pa.Table:
    """Build an artifact table from python columns, in the schema's column order; the optional
    columns of `kind` follow when `columns` has them (and is not None)."""
    schema = SCHEMAS[kind]
    missing = [f.name for f in schema if f.name not in columns]
    if missing:
        raise ValueError(f"{kind}: columns missing when building the table: {missing}")
    optional = [pa.field(name, kind_type) for name, kind_type in OPTIONAL.get(kind, [])
                if columns.get(name) is not None]
    schema = pa.schema(list(schema) + optional)
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in schema}, schema=schema)


def extend_table(table: pa.Table, columns: dict, kind: str) -> pa.Table:
    """The input table's known columns plus new ones, cast to the schema of `kind`."""
    merged = {name: table[name] for name in table.column_names}
    merged.update(columns)
    return make_table(merged, kind)


def temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_bytes_atomically(path: str | Path, data: bytes | str) -> None:
    """Any non-Parquet output (reports, plots): temporary sibling, then rename, never half-written."""
    path = Path(path)
    temporary = temporary_sibling(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise OarError(f"{path}: cannot write ({error.strerror or error})") from None


def write_parquet(table: pa.Table, path: str | Path) -> None:
    """Write to a hidden temporary file in the same folder, fsync, then rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_sibling(path)
    try:
        pq.write_table(table, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:  # Ctrl-C or an Arrow error too: never leave the temporary behind
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OarError(f"{path}: cannot write ({error.strerror or error})") from None
        raise
