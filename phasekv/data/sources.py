"""From a run's data settings to an example stream: synthetic recall (default), a text corpus, or a mixture."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tokenizers import Tokenizer

from phasekv.data.corpus import TextStream, build_shards
from phasekv.data.needle import NeedleConfig, NeedleStream, needle_tokenizer
from phasekv.data.recall import RecallConfig, RecallStream, recall_tokenizer
from phasekv.data.stream import MixtureStream, Stream
from phasekv.data.tokenizer import load_tokenizer
from phasekv.errors import ConfigError


@dataclass
class DataConfig:
    """Where a run's examples come from: synthetic recall (default), the needle test's task, a text corpus, or a
    mixture of text and recall."""

    data: str = "recall"  # "recall", "needle" (the needle test's records at the run's length), or corpus files /
    #                       dirs / globs, comma-separated (python-docs: Python's docs)
    tokenizer: str | None = None  # tokenizer.json or HF dir; default: the word tokenizer (recall, needle)
    recall_mix: float = 0.0  # with a corpus: fraction of sequences that are synthetic recall
    recall: RecallConfig = field(default_factory=RecallConfig)  # recall layout (seq_len is the run's)
    needle: NeedleConfig = field(default_factory=NeedleConfig)  # needle layout (seq_len is the run's)
    cache_dir: str | None = None  # token shard cache (default ~/.cache/phasekv/shards)
    workers: int = 0  # tokenizer processes (0 = one per CPU)
    val_fraction: float = 0.01  # held-out tail of every shard

    @property
    def is_recall(self) -> bool:
        return self.data == "recall"

    @property
    def is_needle(self) -> bool:
        return self.data == "needle"

    def __post_init__(self):
        if isinstance(self.recall, dict):
            self.recall = RecallConfig.from_dict(self.recall)
        if isinstance(self.needle, dict):
            self.needle = NeedleConfig.from_dict(self.needle)
        if not 0 <= self.recall_mix <= 1:
            raise ConfigError(f"recall_mix must be in [0, 1], got {self.recall_mix}")
        if self.recall_mix and (self.is_recall or self.is_needle):
            raise ConfigError(f"recall_mix needs a text corpus in --data, got {self.data!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def data_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The run's tokenizer: `--tokenizer` when given, else the recall layout's word tokenizer (recall only)."""
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
    if cfg.is_needle:
        return needle_tokenizer(cfg.needle)
    if not cfg.is_recall:
        raise ConfigError("a text corpus needs --tokenizer (an existing tokenizer.json, or train one with "
                          "`phasekv tokenizer train CORPUS --out tokenizer.json`)")
    return recall_tokenizer(cfg.recall)


def build_stream(cfg: DataConfig, tok: Tokenizer, seq_len: int, seed: int, split: str = "train",
                 progress: bool = True) -> Stream:
    """The example stream of a run for `split` ("train", "val" or "probe")."""
    if cfg.is_needle:
        return NeedleStream(tok, NeedleConfig.from_dict({**cfg.needle.to_dict(), "seq_len": seq_len}), seed=seed,
                            split=split)
    rcfg = RecallConfig.from_dict({**cfg.recall.to_dict(), "seq_len": seq_len})
    if cfg.is_recall:
        return RecallStream(tok, rcfg, seed=seed, split=split)
    shards = build_shards(cfg.data, tok, cfg.cache_dir, cfg.workers or None, progress=progress)
    text = TextStream(shards, seq_len, seed=seed, split="val" if split == "probe" else split,
                      val_fraction=cfg.val_fraction)
    if not cfg.recall_mix:
        return text
    recall = RecallStream(tok, rcfg, seed=seed, split=split)
    return MixtureStream([text, recall], [1 - cfg.recall_mix, cfg.recall_mix], seed=seed, split=split)
