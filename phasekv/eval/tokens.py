"""Token-exact word placement for any tokenizer (phasekv word-level `tokenizers`, or Hugging Face).

Prompts are built as word sequences. Each word must be ONE token as it appears mid-text (after a
space); the prompt text is tokenised the normal way (special tokens included) and the ids must equal
special-prefix + one id per word, or the run fails. Word lists are filtered to single-token words; where a
tokenizer splits too many of them (a small BPE trained on text), the prompts take the tokenizer's own
single-token words instead (`prompt_words`): multi-token keys would make the record length, and with it every
record's phase, depend on the words drawn, where one token per word keeps the placement exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from importlib import resources

from tokenizers import Tokenizer

from phasekv.data.words import ROLES, choose_words, vocab_words
from phasekv.errors import DataError

_PROBE = "the"  # context word: mid-text ids are read as the tokens that follow it


def word_list(name: str) -> list[str]:
    """A shipped word list (`phasekv/data/words/NAME.txt`), one word a line."""
    path = resources.files("phasekv.data") / "words" / f"{name}.txt"
    if not path.is_file():
        raise DataError(f"word list not found: phasekv/data/words/{name}.txt")
    return [w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()]


class WordTokenizer:
    """Uniform view of a `tokenizers.Tokenizer` or a `transformers` tokenizer for word placement."""

    def __init__(self, tok, name: str = ""):
        self.tok = tok
        self.name = name or type(tok).__name__
        self.hf = not isinstance(tok, Tokenizer)  # else a transformers tokenizer
        self._ids: dict[str, int | None] = {}
        self._fingerprint: str | None = None
        probe = self.encode(_PROBE, special=False)
        full = self.encode(_PROBE, special=True)
        i = _find(full, probe)
        if i < 0:
            raise DataError(f"tokenizer {self.name}: cannot locate text among the special tokens it adds")
        self.prefix, suffix = full[:i], full[i + len(probe) :]
        if suffix:
            raise DataError(f"tokenizer {self.name} appends special tokens {suffix} after the text; "
                            "prompts must end with the query token")
        self.lead = self._detect_lead()

    def encode(self, text: str, special: bool = True) -> list[int]:
        if self.hf:
            return list(self.tok(text, add_special_tokens=special)["input_ids"])
        return list(self.tok.encode(text, add_special_tokens=special).ids)

    def decode_id(self, i: int) -> str:
        if self.hf:
            return self.tok.convert_ids_to_tokens(int(i))
        return self.tok.id_to_token(int(i)) or f"<{i}>"

    @property
    def fingerprint(self) -> str:
        """What identifies how the tokenizer tokenises prompts: its serialisation (a `tokenizers` one, or a fast
        transformers tokenizer's backend), special prefix and lead; a tokenizer without one is only itself."""
        if self._fingerprint is None:
            backend = getattr(self.tok, "backend_tokenizer", None) if self.hf else self.tok
            text = backend.to_str() if backend is not None else f"object {id(self)}"
            self._fingerprint = hashlib.sha256(f"{text}|{self.prefix}|{self.lead!r}".encode()).hexdigest()
        return self._fingerprint

    @property
    def vocab_size(self) -> int:
        return len(self.tok) if self.hf else self.tok.get_vocab_size()

    def word_id(self, word: str) -> int | None:
        """The single mid-text token of `word`, or None when it is several tokens or unknown."""
        if word not in self._ids:
            base = self.encode(_PROBE, special=False)
            ids = self.encode(f"{_PROBE} {word}", special=False)
            ok = len(ids) == len(base) + 1 and ids[: len(base)] == base and ids[-1] not in self.unknown_ids()
            self._ids[word] = ids[-1] if ok else None
        return self._ids[word]

    def single(self, word: str) -> bool:
        return self.word_id(word) is not None

    def vocab_texts(self) -> Iterator[str]:
        """Every token decoded alone, in id order ('' for special tokens)."""
        for i in range(self.vocab_size):
            yield self.tok.decode([i], skip_special_tokens=True)

    def unknown_ids(self) -> set[int]:
        unk = getattr(self.tok, "unk_token_id", None) if self.hf else self.tok.token_to_id("<unk>")
        return {unk} if unk is not None else set()

    def single_tokens(self, words: Sequence[str], what: str, need: int) -> tuple[list[str], list[int]]:
        """Words (and ids) of `words` that are single distinct tokens; DataError when fewer than `need`."""
        kept, ids, seen = [], [], set()
        for w in words:
            i = self.word_id(w)
            if i is not None and i not in seen:
                kept.append(w)
                ids.append(i)
                seen.add(i)
        if len(kept) < need:
            raise DataError(
                f"only {len(kept)} of {len(words)} {what} words are single tokens in tokenizer {self.name}; "
                f"need at least {need} (lower the record count or use another tokenizer)"
            )
        return kept, ids

    def text(self, words: Sequence[str]) -> str:
        return self.lead + " ".join(words)

    def expected(self, words: Sequence[str]) -> list[int]:
        ids = [self.word_id(w) for w in words]
        if None in ids:
            bad = words[ids.index(None)]
            raise DataError(f"word {bad!r} is not a single token in tokenizer {self.name}")
        return self.prefix + ids

    def _detect_lead(self) -> str:
        """'' (word-level, sentencepiece dummy prefix) or ' ' (GPT-2 style BPE): the text start that makes
        the first word tokenise like a mid-text word."""
        words = [w for w in ("the", "cat", "a", "dog") if self.word_id(w) is not None][:2]
        if not words:  # a tokenizer of other words: two of its own
            words = [w for pool in vocab_words(self.vocab_texts(), self.single, 1).values() for w in pool][:2]
        if not words:
            return ""
        for lead in ("", " "):
            self.lead = lead
            if self.encode(self.text(words)) == self.expected(words):
                return lead
        return ""

    def check(self, words: Sequence[str], where: str) -> list[int]:
        """Tokenise the prompt text and require the ids to be exactly special prefix + one id per word."""
        ids = self.encode(self.text(words))
        want = self.expected(words)
        if ids != want:
            k = next((j for j, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b), min(len(ids), len(want)))
            raise DataError(
                f"{where}: token placement mismatch at position {k} after tokenisation with {self.name} "
                f"(got {ids[k:k + 3]}, expected {want[k:k + 3]}; lengths {len(ids)} vs {len(want)})"
            )
        return ids


def prompt_words(tok: WordTokenizer, lists: dict[str, str], counts: dict[str, int], need: dict[str, int],
                 source: str = "auto") -> tuple[str, dict[str, list[str]]]:
    """The keys, values and filler of a prompt set (role -> single-token words) and their source, "lists" or
    "vocab" (`phasekv.data.words.choose_words`): the shipped lists named in `lists`, each cut to its first
    `counts[role]` words (0: all), or the tokenizer's own words, as many per role as those lists give. "auto"
    takes the lists when every role keeps `need[role]` single tokens and, where a count is given (the words a
    recall run was trained on), all of its words are single tokens, as the run's own data did."""
    words = {r: word_list(lists[r])[: counts[r] or None] for r in ROLES}
    least = {r: max(need[r], len(words[r]) if counts[r] else 0) for r in ROLES}
    source, words = choose_words(source, words, least, tok.single, tok.vocab_texts())
    return source, {r: tok.single_tokens(words[r], what, need[r])[0]
                    for r, what in zip(ROLES, ("key", "value", "filler"), strict=True)}


def _find(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    return -1
