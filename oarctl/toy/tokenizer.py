"""Character-level tokenizer for the toy world, built offline (no hub, no training data).

One character is one token, so a wrong digit is exactly one wrong token (clean credit assignment).
It is a genuine `Qwen2Tokenizer` (byte-level BPE, Qwen pre-tokenizer) whose merge list is empty:
with no merges, byte-level BPE emits one token per character. This matters because
`AutoTokenizer.from_pretrained` on a directory whose config.json says `qwen2` always rebuilds a
Qwen2Tokenizer pipeline from the saved vocab; a custom pipeline would silently change on reload.
A few strings are added as single tokens (`\\boxed{`, the chat role names) to keep the chat
template and answers short.
"""
from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]
ADDED_TOKENS = ["\\boxed{", "user", "assistant", "system"]
# Printable ASCII covers the task text and any plausible edit of it; "\t\n" for the template.
# Other characters have no token (byte-level BPE without merges drops them).
CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map, which byte-level BPE vocabularies use."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in mapping:
            mapping[b], extra = chr(256 + extra), extra + 1
    return mapping


def _vocab() -> dict[str, int]:
    """Special tokens first (ids 0-2, as in Qwen), then one entry per character."""
    to_unicode = _byte_to_unicode()
    tokens = SPECIAL_TOKENS + [to_unicode[ord(c)] for c in CHARACTERS]
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The toy tokenizer, ready for `save_pretrained` / `AutoTokenizer.from_pretrained`."""
    tokenizer = Qwen2Tokenizer(
        vocab=_vocab(), merges=[], unk_token=None, pad_token=PAD, eos_token=EOS, bos_token=None,
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=512,
        extra_special_tokens=[BOS],
    )
    tokenizer.add_tokens(ADDED_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def format_prompt(tokenizer, problem: str) -> str:
    """The chat-formatted prompt text for one problem, ending with the assistant header."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": problem}], tokenize=False, add_generation_prompt=True)
