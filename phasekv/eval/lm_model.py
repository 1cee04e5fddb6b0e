"""phasekv's models as an lm-evaluation-harness model type: `--model phasekv --model_args run=DIR`.

Any model `phasekv eval --model` takes (a phasekv run of any design, compressed or not, a PhaseLM.save
directory, a Hugging Face causal LM directory) runs under lm-eval through `phasekv.eval.models.load`, scored
by the same `last_logits` as `phasekv eval` (a PhaseLM prefills long prompts chunk by chunk through its
cache), with the prompts tokenised by the same tokenizer. lm-eval 0.4.13 discovers no third-party model types
(no entry points, no plug-in path): its registry is filled in the process that runs it, so importing this
module registers the type, and `phasekv lm-eval ARGS` runs lm-eval's own command line after that import.

Model args: run (the model directory; or pretrained, which lm-eval also names its output folder after), tokenizer (a tokenizer file/dir instead of the model's),
trust_remote_code; lm-eval's --device and --batch_size ("auto": 32 prompts per forward pass).
Continuations are scored in one forward pass per batch of equal-length inputs; generation is greedy, through the
model's decode cache.
"""

from __future__ import annotations

import logging
from itertools import islice
from pathlib import Path

import lm_eval.models  # noqa: F401  lm-eval's own model types: it registers them only into an empty registry
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from phasekv.data.tokenizer import special_ids
from phasekv.errors import ConfigError
from phasekv.eval.models import all_logits, greedy, last_logits, load, resolve_device
from phasekv.progress import progress_bar

AUTO_BATCH = 32  # prompts per forward pass under --batch_size auto
log = logging.getLogger("lm_eval")  # lm-eval's own log


@register_model("phasekv")
class PhaseKVLM(TemplateLM):
    """An `EvalModel` (`phasekv.eval.models.load`) behind lm-eval's model interface."""

    def __init__(self, run: str | None = None, pretrained: str | None = None, device: str | None = None,
                 batch_size: int | str = AUTO_BATCH, max_batch_size: int | None = None, tokenizer: str | None = None,
                 trust_remote_code: bool = False, **unused):  # max_batch_size: lm-eval passes it; batches are fixed
        super().__init__()
        if unused:
            raise ConfigError(f"--model_args: unknown argument(s) {', '.join(unused)} for --model phasekv "
                              "(known: run or pretrained, tokenizer, trust_remote_code)")
        if (run is None) == (pretrained is None):
            raise ConfigError("--model_args: give run=DIR (or pretrained=DIR), one of the two")
        device = resolve_device(device or "auto")
        if str(device).startswith("cuda") and not torch.cuda.is_available():  # lm_eval's default is cuda:0
            log.warning(f"--device {device}: CUDA is not available, running on the CPU")
            device = "cpu"
        self.em = load(Path(run or pretrained), device=device, trust_remote_code=trust_remote_code,
                       tokenizer=tokenizer)
        text = str(batch_size)
        self.batch = int(text) if text.isdigit() else AUTO_BATCH  # "auto", "auto:N"
        if self.batch < 1:
            raise ConfigError(f"--batch_size {batch_size} must be >= 1")
        self.tokenizer = self.em.tok.tok  # what lm-eval's helpers (chat templates, logging) look at
        self._device = self.em.device

    # ------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        """End of sequence: where generation stops, and lm-eval's context for an empty one."""
        eos = self.tokenizer.eos_token_id if self.em.tok.hf else special_ids(self.tokenizer)["eos"]
        return eos if eos is not None else (self.em.tok.prefix or [0])[0]  # a tokenizer without one: its BOS

    @property
    def max_length(self) -> int:
        cfg = self.em.model.config
        return int(getattr(cfg, "max_seq_len", None) or getattr(cfg, "max_position_embeddings", None) or 2048)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As `phasekv eval` tokenises a prompt: the tokenizer's special tokens added unless told otherwise."""
        return self.em.tok.encode(string, special=add_special_tokens is not False)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    # ------------------------------------------------------------------ scoring

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log P(continuation | context), every continuation token the full-vocabulary argmax) per request
        ((strings), context ids, continuation ids), batched over requests of equal total and continuation length
        (lm-eval's `Collator`: no padding, whose positions would shift every phase)."""
        order = Collator(requests, sort_fn=_lengths, group_fn=lambda r: {"lengths": _lengths(r)},
                         group_by="gen_kwargs")  # batches of one group: by a dict, as lm-eval groups generations
        out = []
        with progress_bar(not disable_tqdm, len(requests), "lm-eval loglikelihood") as advance:
            for batch in order.get_batched(n=self.batch):
                out += self._score(batch)
                advance(len(batch))
        return order.get_original(out)

    @torch.no_grad()
    def _score(self, batch: list) -> list[tuple[float, bool]]:
        """One batch of requests of equal lengths, each (log P, greedy)."""
        k = len(batch[0][2])
        ids = torch.tensor([(ctx + cont)[:-1] for _, ctx, cont in batch], device=self.em.device)  # (B, T-1)
        logp = F.log_softmax(self._tail_logits(ids, k), -1)  # (B, k, V)
        cont = torch.tensor([cont for _, _, cont in batch], device=self.em.device)  # (B, k)
        lp = logp.gather(2, cont[..., None])[..., 0].sum(-1)  # (B,)
        greedy = (logp.argmax(-1) == cont).all(-1)  # (B,)
        return list(zip(lp.tolist(), greedy.tolist(), strict=True))

    def _tail_logits(self, ids: torch.Tensor, k: int) -> torch.Tensor:
        """Logits at the last k positions of ids (B, T), (B, k, V) float32: one token through `last_logits`
        (the path `phasekv eval` scores by), more through one full forward pass."""
        if k == 1:
            return last_logits(self.em.model, ids)[:, None]
        return all_logits(self.em.model, ids)[:, -k:]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log P(text) over disjoint windows of the model's length (lm-eval's rolling windows)."""
        out = []
        with progress_bar(not disable_tqdm, len(requests), "lm-eval loglikelihood_rolling") as advance:
            for (text,) in (r.args for r in requests):
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)]
                scored = self._loglikelihood_tokens([(None, c, t) for c, t in windows], disable_tqdm=True)
                out.append(sum(lp for lp, _ in scored))
                advance()
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context, up to max_gen_toks tokens, the end of sequence or the first `until`
        string, through the model's decode cache (`greedy`: one prefill, then one one-token step per new token)."""
        out = []
        with progress_bar(not disable_tqdm, len(requests), "lm-eval generate_until") as advance:
            for context, kw in (r.args for r in requests):
                out.append(self._generate(context, kw))
                advance()
        return out

    def _generate(self, context: str, kw: dict) -> str:
        if kw.get("do_sample"):
            raise ConfigError("--model phasekv decodes greedily: set do_sample false")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else until
        new = []
        for token in islice(greedy(self.em.model, self.tok_encode(context)), int(kw.get("max_gen_toks", 256))):
            if token == self.eot_token_id:
                break
            new.append(token)
            if any(u in self.tok_decode(new) for u in until):
                break
        text = self.tok_decode(new)
        for u in until:
            text = text.split(u)[0]
        return text

    def get_model_info(self) -> dict:
        """What `phasekv analyze lm-eval` reads back from the results (the model's name, stride, provenance)."""
        em = self.em
        return {"phasekv": {"name": em.name, "kind": em.kind, "stride": em.stride, "info": em.info}}


def _lengths(request) -> tuple[int, int]:
    """What a batch of requests shares: their total and continuation lengths."""
    _, context, continuation = request
    return len(context) + len(continuation), len(continuation)
