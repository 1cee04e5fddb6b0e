"""`trim`: a step's examples sorted by length into its micro-batches, each cut after its last target, give the
step of the whole batch (the model is causal, so the padding after the last target changes no target's logit)."""

import json

import numpy as np
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.data.recall import RecallConfig, RecallStream, recall_tokenizer
from phasekv.data.stream import IGNORE, Example, batch, by_length, length
from phasekv.train import train

from .helpers import FAST, final_weights

RECALL = RecallConfig(seq_len=96, min_records=2, max_records=16, n_keys=32, n_values=32, max_prefix=24,
                      min_distance=16, gap_prob=1.0, max_gap=4)  # the demo's layout: a ragged tail of padding


def test_length_counts_up_to_the_last_target():
    labels = np.full(8, IGNORE)
    assert length(Example(np.zeros(8, dtype=np.int64), labels)) == 1  # no target: one token, never empty
    labels[[2, 5]] = 7
    assert length(Example(np.zeros(8, dtype=np.int64), labels)) == 6


def test_by_length_keeps_every_target_in_shorter_micro_batches():
    stream = RecallStream(recall_tokenizer(RECALL), RECALL, seed=0)
    examples = [stream.example(i) for i in range(32)]
    parts = by_length(examples, 4)
    assert [p["input_ids"].shape[0] for p in parts] == [8, 8, 8, 8]
    cuts = [p["input_ids"].shape[1] for p in parts]
    assert cuts == sorted(cuts) and cuts[0] < RECALL.seq_len  # shortest first; padding cut off
    whole = batch(stream, 0, 32)
    assert sum(int((p["labels"] != IGNORE).sum()) for p in parts) == int((whole["labels"] != IGNORE).sum())
    for p in parts:  # every row: its example's tokens up to the cut, all its targets inside
        for ids, labels in zip(p["input_ids"], p["labels"], strict=True):
            i = next(i for i, e in enumerate(examples) if np.array_equal(e.ids[: len(ids)], ids.numpy())
                     and np.array_equal(e.labels[: len(ids)], labels.numpy()))
            assert length(examples[i]) <= len(ids)


@pytest.mark.parametrize("arch", ["W8/S8 · 1 KV", "Full attention · 1 KV", "W8/S4 · 1 KV · V4 compressor"])
def test_trimmed_micro_batches_give_every_target_the_same_logit(arch):
    torch.manual_seed(0)
    tok = recall_tokenizer(RECALL)
    model = PhaseLM(ModelConfig.from_name(arch, preset="tiny", vocab_size=tok.get_vocab_size())).eval()
    stream = RecallStream(tok, RECALL, seed=1)
    whole = batch(stream, 0, 16)
    examples = [stream.example(i) for i in range(16)]
    with torch.no_grad():
        ref = model(whole["input_ids"], select=whole["labels"] != IGNORE)  # (n, V), row-major over the batch
        got = torch.cat([model(p["input_ids"], select=p["labels"] != IGNORE) for p in by_length(examples, 4)])
    per_example = ref.split([int((e.labels != IGNORE).sum()) for e in examples])  # each example's target rows
    order = sorted(range(16), key=lambda i: length(examples[i]))  # by_length's order
    assert torch.allclose(got, torch.cat([per_example[i] for i in order]), atol=1e-5)


def test_a_trimmed_step_equals_the_whole_batch_step(tmp_path):
    """Training with `trim` (4 micro-batches) and without (one batch): the same losses and weights, up to fp32
    summation order (tolerances as for two ranks against one, tests/train/test_distributed.py)."""
    opts = dict(FAST, arch="W8/S8 · 1 KV", steps=3, batch_size=16, seq_len=96, ckpt_every=0, val_every=0,
                gate_steps="none", data={"data": "recall", "recall": RECALL.to_dict()})
    train(out=str(tmp_path / "whole"), **opts)
    train(out=str(tmp_path / "trim"), grad_accum=4, trim=True, **opts)
    a, b = final_weights(tmp_path / "whole"), final_weights(tmp_path / "trim")
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert (diff <= 1e-5).float().mean() >= 0.99 and diff.max() <= 2 * opts["steps"] * 3e-3
    rows = [[json.loads(r) for r in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("whole", "trim")]
    losses = [[r["loss"] for r in rs if "loss" in r] for rs in rows]
    assert len(losses[0]) == 3 and np.allclose(losses[0], losses[1], rtol=1e-5)
