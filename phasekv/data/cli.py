"""`phasekv tokenizer ...`: train a byte-level BPE, write the word tokenizer, pre-tokenize a corpus."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from phasekv.data.corpus import TextStream, build_shards, iter_corpus
from phasekv.data.tokenizer import build_word_tokenizer, load_tokenizer, save_tokenizer, train_bpe

app = typer.Typer(help="Tokenizers: byte-level BPE for text corpora, the word tokenizer of recall data, shards.",
                  no_args_is_help=True)
console = Console(stderr=True)


@app.command("train")
def train_cmd(
    corpus: list[str] = typer.Argument(..., help=".txt / .jsonl (text field) / .parquet (text column) files, dirs, globs."),
    out: Path = typer.Option(Path("tokenizer.json"), "--out", "-o", help="Output tokenizer.json."),
    vocab_size: int = typer.Option(8192, help="Vocabulary size (the `small` preset uses 8192)."),
    min_frequency: int = typer.Option(2, help="Minimum pair frequency of a merge."),
) -> None:
    """Train a byte-level BPE tokenizer (GPT-2/Qwen style, with <pad> <bos> <eos> <unk>) on a corpus."""
    tok = train_bpe(iter_corpus(corpus), vocab_size=vocab_size, min_frequency=min_frequency)
    path = save_tokenizer(tok, out)
    console.print(f"byte-level BPE with {tok.get_vocab_size():,} tokens -> {path}")


@app.command("words")
def words_cmd(out: Path = typer.Option(Path("tokenizer.json"), "--out", "-o", help="Output tokenizer.json.")) -> None:
    """Write the word-level tokenizer of the recall data (every animal, name and filler word is one token)."""
    tok = build_word_tokenizer()
    console.print(f"word tokenizer with {tok.get_vocab_size()} tokens -> {save_tokenizer(tok, out)}")


@app.command("encode")
def encode_cmd(
    corpus: list[str] = typer.Argument(..., help="Corpus files, dirs or globs."),
    tokenizer: str = typer.Option(..., help="tokenizer.json (or HF model dir) to encode with."),
    cache_dir: Path = typer.Option(None, help="Shard cache (default ~/.cache/phasekv/shards or $PHASEKV_CACHE)."),
    workers: int = typer.Option(0, help="Processes (0 = one per CPU)."),
) -> None:
    """Tokenize a corpus once into memory-mapped shards (what `phasekv train --data` reuses)."""
    d = build_shards(corpus, load_tokenizer(tokenizer), cache_dir, workers or None)
    n = TextStream(d, 1, split="train", val_fraction=0.0).n_tokens
    console.print(f"{n:,} tokens in {d}")
    print(d)
