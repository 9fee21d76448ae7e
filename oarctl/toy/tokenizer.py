"""Character-level tokenizer for the toy world, built offline with the `tokenizers` library.

One character is one token, so a wrong digit is exactly one wrong token (clean credit assignment).
A few multi-character strings are added as single tokens (`\\boxed{`, the chat role names) to keep
the chat template short. Decoding concatenates tokens (Fuse decoder), so no spaces are inserted.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
ADDED_TOKENS = ["\\boxed{", "user", "assistant", "system"]
# Printable ASCII covers the task text and any plausible edit of it; "\t\n" for the template.
CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _backend() -> Tokenizer:
    """WordLevel over single characters: the pre-tokenizer isolates every character."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return backend


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The toy tokenizer, ready for `save_pretrained` / `AutoTokenizer.from_pretrained`."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend(),
        pad_token=PAD, eos_token=EOS, unk_token=UNK, bos_token=None,
        padding_side="left", clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [BOS]})
    tokenizer.add_tokens(ADDED_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def format_prompt(tokenizer, problem: str) -> str:
    """The chat-formatted prompt text for one problem, ending with the assistant header."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": problem}], tokenize=False, add_generation_prompt=True)
