"""Tokenizers: the word-level tokenizer of the synthetic recall data, and byte-level BPE for real text.

`build_word_tokenizer()` holds every shipped word; a recall run saves the same construction over only the
words its layout uses (`phasekv.data.recall.recall_tokenizer`). Ids are fixed by construction, so two calls
give identical tokenizers:

    0 <pad>  1 <bos>  2 <eos>  3 <unk>  then the separators  . , : ; ? ! | = > - ( ) ' "
    then the shipped word lists in order: animals, names, filler (each word exactly ONE token).

Text is split on whitespace and every punctuation character is its own token, so
`"cat Alice , dog Bob ?"` and `"cat Alice, dog Bob?"` encode alike. `encode()` prepends `<bos>`
(the training data starts every sequence with it); pass `add_special_tokens=False` to skip it.
Words are case-sensitive (names are capitalised, animals are not); unknown words map to `<unk>`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from phasekv.data.words import load_words
from phasekv.errors import DataError
from phasekv.io import atomic_write

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
SEPARATORS = [".", ",", ":", ";", "?", "!", "|", "=", ">", "-", "(", ")", "'", '"']
WORD_LISTS = ("animals", "names", "filler")


def build_word_tokenizer(lists: Sequence[str] = WORD_LISTS, extra_words: Iterable[str] = ()) -> Tokenizer:
    """Word-level tokenizer over the shipped word lists (+ `extra_words`): every listed word is one token."""
    vocab: dict[str, int] = {}
    for tok in [*SPECIAL_TOKENS, *SEPARATORS, *(w for name in lists for w in load_words(name)), *extra_words]:
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return tok


def train_bpe(
    texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2, show_progress: bool = True
) -> Tokenizer:
    """Byte-level BPE trained on an iterable of documents (the GPT-2 / Qwen recipe), with our special tokens."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def load_tokenizer(spec: str | os.PathLike | None = None) -> Tokenizer:
    """`None`/"word" -> the word tokenizer; a `tokenizer.json` file, or a directory holding one (HF model dir)."""
    if spec is None or str(spec) == "word":
        return build_word_tokenizer()
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise DataError(f"{path}: not a valid tokenizers JSON file ({exc})") from exc


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> Path:
    """Write `tokenizer.json` atomically (`phasekv.io`); `path` may be a directory."""
    path = Path(path)
    if path.is_dir() or not path.suffix:
        path = path / "tokenizer.json"
    return atomic_write(path, tok.save)


def tokenizer_hash(tok: Tokenizer) -> str:
    """Short content hash (ties token shards to the tokenizer that wrote them)."""
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]


def special_ids(tok: Tokenizer) -> dict[str, int | None]:
    """ids of pad/bos/eos, falling back to common spellings (`<|endoftext|>`, `</s>`, ...) for foreign tokenizers."""
    def first(*names: str) -> int | None:
        for n in names:
            i = tok.token_to_id(n)
            if i is not None:
                return i
        return None

    eos = first(EOS, "<|endoftext|>", "</s>", "<|im_end|>", "<eos>")
    return {
        "pad": first(PAD, "[PAD]", "<|endoftext|>", "</s>"),
        "bos": first(BOS, "<s>", "<|begin_of_text|>"),
        "eos": eos,
    }


def to_hf(tok: Tokenizer):
    """Wrap as a `transformers.PreTrainedTokenizerFast` (the type `load_run` returns, like an HF model dir)."""
    from transformers import PreTrainedTokenizerFast  # imported when used: ~1 s

    ids = special_ids(tok)
    kw = {k + "_token": tok.id_to_token(v) for k, v in ids.items() if v is not None}
    if tok.token_to_id(UNK) is not None:
        kw["unk_token"] = UNK
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **kw)


def describe(tok: Tokenizer) -> dict:
    """Small JSON-able summary (vocab size, special ids, hash) for summaries and run configs."""
    return {"vocab_size": tok.get_vocab_size(), "special_ids": special_ids(tok), "hash": tokenizer_hash(tok)}


__all__ = [
    "BOS", "EOS", "PAD", "UNK", "SEPARATORS", "SPECIAL_TOKENS", "WORD_LISTS",
    "build_word_tokenizer", "describe", "load_tokenizer", "save_tokenizer", "special_ids",
    "to_hf", "tokenizer_hash", "train_bpe",
]
