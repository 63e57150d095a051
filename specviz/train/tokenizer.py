"""A byte-level BPE tokenizer for Python source, trained with the `tokenizers` library.

Byte-level (GPT-2 style) pre-tokenisation and decoding, no normalisation, so every UTF-8 text
round-trips exactly: ``decode(encode(s)) == s``. Special tokens: ``<|endoftext|>`` (id 0) is bos and
eos and separates documents in training; ``<|pad|>`` (id 1) pads. Encoding with
``add_special_tokens=True`` (the default) prepends bos, as the models saw at every document start.
Special-token strings that occur inside a text (transformers' own source mentions
"<|endoftext|>") are encoded as ordinary bytes (``split_special_tokens=True``), which keeps the round
trip exact. Saved as an HF ``PreTrainedTokenizerFast`` (tokenizer.json, tokenizer_config.json).
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
EOS_ID = 0
PAD_ID = 1


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on ``texts``.

    vocab_size: total size including the 256 byte symbols and the 2 special tokens (<= 8192 here).
    Returns a `tokenizers.Tokenizer` with ids 0 = <|endoftext|>, 1 = <|pad|>.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOS_TOKEN} $A", pair=f"{EOS_TOKEN} $A {EOS_TOKEN} $B", special_tokens=[(EOS_TOKEN, EOS_ID)]
    )
    tok.encode_special_tokens = True  # "<|endoftext|>" inside a source file is text, not a token
    assert tok.token_to_id(EOS_TOKEN) == EOS_ID and tok.token_to_id(PAD_TOKEN) == PAD_ID
    return tok


def wrap_hf(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """Wrap as an HF fast tokenizer with bos = eos = <|endoftext|>, pad = <|pad|>, no unk."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
    )


def encode_documents(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (the caller inserts <|endoftext|>)."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
