"""A character-level tokenizer of exactly 256 entries, built in memory for the family tests.

One token per character (so any prompt of these characters tokenizes, with exact
offsets), five special tokens, and a ChatML-style chat template.
"""

from __future__ import annotations

from functools import cache

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZE = 256


@cache
def _vocab() -> dict[str, int]:
    chars = ["\n", "\t"] + [chr(c) for c in range(32, 127)] + [chr(c) for c in range(0xA1, 0x100)]
    chars += [chr(c) for c in range(0x4E00, 0x4E00 + SIZE - len(SPECIALS) - len(chars))]
    return {tok: i for i, tok in enumerate(SPECIALS + chars)}


def tiny_tokenizer(chat: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=SPECIALS[4:])
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    assert len(fast) == SIZE
    return fast
