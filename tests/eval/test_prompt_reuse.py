"""Built prompts are shared within a process by config and tokenizer content, never across either."""

from tokenizers import Tokenizer

from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.eval import prompts as P
from phasekv.eval.tokens import WordTokenizer


def cfg(**kw):
    return P.lookup_config(records=8, demos=2, filler=24, modulus=4, per_group=16, mappings=2, **kw)


def test_same_config_and_tokenizer_content_share_prompts():
    raw = build_word_tokenizer()
    a = P.RetrievalPrompts(cfg(), WordTokenizer(raw, "run a"))
    b = P.RetrievalPrompts(cfg(), WordTokenizer(Tokenizer.from_str(raw.to_str()), "run b"))  # another model's copy
    first = [a.prompt(i) for i in range(len(a))]
    assert [b.prompt(i) for i in range(len(b))] == first and b.prompt(5) is first[5]
    assert all(a._build(i) == first[i] for i in (0, 7, len(a) - 1))  # the shared prompt is the one built


def test_other_config_or_tokenizer_is_built_apart():
    raw = build_word_tokenizer()
    base = P.RetrievalPrompts(cfg(), WordTokenizer(raw))
    other_padding = P.RetrievalPrompts(cfg(padding="in-sequence"), WordTokenizer(raw))
    assert other_padding.prompt(3) is not base.prompt(3) and other_padding.prompt(3).words != base.prompt(3).words
    bigger = build_word_tokenizer(extra_words=["zyzzyva"])  # other ids: other prompts
    assert WordTokenizer(bigger).fingerprint != WordTokenizer(raw).fingerprint


def test_a_process_keeps_a_bounded_number_of_prompt_sets():
    tok = WordTokenizer(build_word_tokenizer())
    for seed in range(P.SHARED_SETS + 3):
        P.RetrievalPrompts(cfg(seed=seed), tok).prompt(0)
    assert len(P._BUILT) == P.SHARED_SETS
