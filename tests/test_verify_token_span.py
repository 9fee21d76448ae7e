"""The verified artifact's answer token span: character span -> tokens, and the tokenizer check."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from conftest import write_rollouts
from oarctl.verify.token_span import token_span


class PieceTokenizer:
    """Token i decodes to PIECES[i]; ids 90 and 91 are the two halves of `é` (U+FFFD until whole);
    id 0 is a special token (dropped by skip_special_tokens), like eos."""
    PIECES = {1: "The", 2: " answer", 3: " is", 4: " \\boxed{", 5: "12", 6: "}", 7: " caf", 8: "x"}

    def decode(self, ids, skip_special_tokens=True):
        text, pending = "", False
        for token in ids:
            if token == 0:
                continue
            if token == 90:
                pending = True
                continue
            if token == 91 and pending:
                text, pending = text + "é", False
                continue
            text += self.PIECES[token]
        return text + ("\ufffd" if pending else "")


@pytest.mark.parametrize("ids, answer, expected", [
    ([1, 2, 3, 4, 5, 6, 0], "12", (4, 5)),          # one token, eos after
    ([1, 2, 3, 4, 5, 5, 6], "1212", (4, 6)),        # two tokens
    ([7, 90, 91, 8], "éx", (1, 4)),                 # a character split over two tokens goes whole
    ([7, 90, 91, 8], "x", (3, 4)),
    ([7, 90, 91, 8], "caf", (0, 1)),
])
def test_token_span_covers_exactly_the_tokens_of_the_characters(ids, answer, expected):
    tokenizer = PieceTokenizer()
    text = tokenizer.decode(ids)
    start = text.rindex(answer)
    assert token_span(tokenizer, ids, start, start + len(answer)) == expected


def test_no_answer_has_no_token_span():
    assert token_span(PieceTokenizer(), [1, 2], -1, -1) == (-1, -1)


def test_verify_writes_token_spans_that_decode_to_the_answer(cli, tmp_path):
    from oarctl.checkpoints import load_tokenizer
    from oarctl.toy import base_policy_dir

    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows=4)
    assert cli("verify", rollouts, "-o", tmp_path / "verified.parquet").exit_code == 0
    table = pq.read_table(tmp_path / "verified.parquet").to_pylist()
    tokenizer = load_tokenizer(base_policy_dir())
    for row in table:
        start, end = row["answer_token_start"], row["answer_token_end"]
        assert 0 <= start < end <= len(row["response_token_ids"])
        assert tokenizer.decode(row["response_token_ids"][start:end]) == row["extracted_answer"]


def test_verify_refuses_a_tokenizer_that_did_not_sample_the_rollouts(cli, tmp_path):
    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows=2, response_text=["\\boxed{7}", "\\boxed{7}"])
    result = cli("verify", rollouts, "-o", tmp_path / "verified.parquet")
    assert result.exit_code == 2
    assert "row 0: response_token_ids do not decode to response_text" in result.stderr
    assert not (tmp_path / "verified.parquet").exists()
