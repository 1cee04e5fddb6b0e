"""Training data: the word tokenizer, synthetic associative recall, text corpora and their mixture.

- `build_word_tokenizer()`: the word-level `tokenizers.Tokenizer` over every animal, name and filler word of
  `phasekv/data/words/`, each ONE token; `recall_tokenizer(RecallConfig)`: the one a recall run saves, holding
  only the words its layout uses (no never-seen output classes).
- `RecallStream` / `RecallConfig`: the default training data; `recall_accuracy()`: held-out accuracy by phase.
- `TextStream` / `build_shards()`: text corpora tokenized once into memory-mapped shards (`python-docs`: Python's
  own documentation, a corpus on every machine); recall mixed into text takes the tokenizer's own single-token
  words where it splits the shipped lists (`phasekv.data.words.choose_words`, shared with the evaluation).
- `build_stream(DataConfig, ...)`: what `phasekv train --data ...` uses.

Layer: above `phasekv.model`, below `phasekv.train` (and everything that evaluates). Data imports only the
foundation (`errors`, `io`): a stream is a pure function of (seed, split, index) and knows no model, so the
same examples feed training, validation and the evaluations. It sits above the model layer so that its
held-out measure, `recall_accuracy(model, ...)`, may take a model; it reads only the model's logits.
"""

from phasekv.data.corpus import TextStream, build_shards, iter_corpus, iter_documents, resolve_files
from phasekv.data.recall import RecallConfig, RecallStream, recall_accuracy, recall_tokenizer
from phasekv.data.sources import DataConfig, build_stream, data_tokenizer
from phasekv.data.stream import IGNORE, Example, MixtureStream, batch, collate
from phasekv.data.tokenizer import build_word_tokenizer, load_tokenizer, save_tokenizer, to_hf, train_bpe
from phasekv.data.words import load_words

__all__ = [
    "IGNORE", "DataConfig", "Example", "MixtureStream", "RecallConfig", "RecallStream", "TextStream",
    "batch", "build_shards", "build_stream", "build_word_tokenizer", "collate", "data_tokenizer",
    "iter_corpus", "iter_documents", "load_tokenizer", "load_words", "recall_accuracy", "recall_tokenizer", "resolve_files",
    "save_tokenizer", "to_hf", "train_bpe",
]
