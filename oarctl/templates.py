"""Prompt templates: how a problem becomes the text the policy is prompted with.

`data.prompt_template` is a registry name or a user template:
    chat             the model's own chat template, the problem as the user turn (the default)
    qwen25-math-cot  the model's chat template with Qwen2.5-Math's CoT system instruction, as its
                     evaluation harness prompts (needs a tokenizer with a chat template)
    base             plain text for base models, no chat tokens
    anything else    a path to a text file, or a string, containing `{problem}`
Chat-format prompts (a prompts row with `messages`, as TRL takes prompts) bring their own turns: they go
through the model's chat template as they are, whatever the template (`encode_prompt`).

User templates substitute `{problem}` and nothing else: other braces stay literal (LaTeX such as
`\\boxed{}` would break `str.format`), and the text is never evaluated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from oarctl.errors import OarError
from oarctl.registry import Registry

DEFAULT = "chat"
PLACEHOLDER = "{problem}"
QWEN25_MATH_COT_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
BASE_TEXT = "Question: {problem}\nAnswer: Let's think step by step."

# name -> (tokenizer, problem) -> prompt text
TEMPLATES = Registry("prompt template")


def _chat(tokenizer, messages: list[dict]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise OarError("data.prompt_template: the policy's tokenizer has no chat template; "
                       "use data.prompt_template=base (or a text template) for a base model")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@TEMPLATES.register("chat")
def chat(tokenizer, problem: str) -> str:
    """The model's chat template, the problem as the user turn."""
    return _chat(tokenizer, [{"role": "user", "content": problem}])


@TEMPLATES.register("qwen25-math-cot")
def qwen25_math_cot(tokenizer, problem: str) -> str:
    """The chat template with Qwen2.5-Math's step-by-step, \\boxed{} system turn."""
    return _chat(tokenizer, [{"role": "system", "content": QWEN25_MATH_COT_SYSTEM},
                             {"role": "user", "content": problem}])


@TEMPLATES.register("base")
def base(tokenizer, problem: str) -> str:
    """Plain text for base models: `Question: ...` then `Answer: Let's think step by step.`"""
    return substitute(BASE_TEXT, problem)


def substitute(text: str, problem: str) -> str:
    return text.replace(PLACEHOLDER, problem)


@dataclass(frozen=True)
class Template:
    name: str          # registry name, or "text" for a user template
    text: str | None   # the user template's text (None for registry entries)

    @property
    def identity(self) -> str:
        """What the cache key records: the name, or the template's own text (not its path)."""
        return self.name if self.text is None else f"text:{self.text}"

    @property
    def uses_chat_tokens(self) -> bool:
        return self.name in ("chat", "qwen25-math-cot")


def resolve(spec: str) -> Template:
    """A registry name, an existing file, or a literal string with {problem}; anything else is an error."""
    if spec in TEMPLATES:
        return Template(spec, None)
    path = Path(spec)
    if PLACEHOLDER not in spec and len(spec) < 4096 and path.is_file():
        text = path.read_text()
        if PLACEHOLDER not in text:
            raise OarError(f"{path}: prompt template has no {PLACEHOLDER} placeholder (data.prompt_template)")
        return Template("text", text)
    if PLACEHOLDER in spec:
        return Template("text", spec)
    raise OarError(f"config: data.prompt_template: {spec!r} is not a template name ({', '.join(TEMPLATES.names())}), "
                   f"an existing file, or a string containing {PLACEHOLDER}")


def render(tokenizer, problem: str, spec: str | Template = DEFAULT) -> str:
    template = spec if isinstance(spec, Template) else resolve(spec)
    if template.text is not None:
        return substitute(template.text, problem)
    return TEMPLATES.get(template.name)(tokenizer, problem)


def encode(tokenizer, problem: str, spec: str | Template = DEFAULT) -> list[int]:
    """Prompt token ids. Chat templates already hold their special tokens; plain text gets the
    tokenizer's usual ones (a BOS for Llama-style tokenizers, nothing for Qwen's)."""
    template = spec if isinstance(spec, Template) else resolve(spec)
    text = render(tokenizer, problem, template)
    return tokenizer(text, add_special_tokens=not template.uses_chat_tokens)["input_ids"]


def encode_prompt(tokenizer, row: dict, spec: str | Template = DEFAULT) -> list[int]:
    """A prompts row's token ids: a chat-format row (its `messages`, JSON) through the model's chat
    template with the generation prompt, as TRL encodes conversational prompts; any other through `spec`."""
    if row.get("messages"):
        text = _chat(tokenizer, json.loads(row["messages"]))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return encode(tokenizer, row["problem"], spec)
