"""Evaluation through an inference engine: the model a team serves (vLLM's OpenAI-compatible server, or any
server speaking its completions protocol) scored on the same prompts as a model in process.

Every prompt goes out as token ids (its placement stays token-exact) in a completions request with
max_tokens=1, temperature=0, the top-k next-token log-probabilities and the tokens returned as ids (vLLM's
`return_tokens_as_token_ids`):
- the prediction is the top-1 of that distribution (highest raw log-probability, lowest id on a tie, as
  argmax in process; the server's sampling settings cannot change it);
- the right answer's probability comes from the same list, or, where the answer is not among the top k, from
  a second request that appends the answer to the prompt and reads its prompt log-probability (vLLM's
  `prompt_logprobs`); `model_info.engine` in the summary counts the answers read that way.
Requests carry --batch-size prompts each, --concurrency of them in flight, and are retried with exponential
backoff on connection errors, HTTP 429 and 5xx. Before any prompt a probe checks that the server serves the
model, that its tokenizer encodes a sample prompt to our ids (`/tokenize`) and that it returns
log-probabilities. `phasekv.eval.run` flushes and resumes the rows as for a model in process.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from phasekv.data.tokenizer import load_tokenizer
from phasekv.errors import ConfigError, PhaseKVError
from phasekv.eval.models import EvalModel, config_json, evaluation_info, hf_ratios, hf_stride
from phasekv.eval.prompts import Prompt
from phasekv.eval.tokens import WordTokenizer, word_list

RETRY_STATUS = (429, 500, 502, 503, 504)  # busy or failing server: worth another try
API_KEY_ENV = "PHASEKV_SERVER_API_KEY"  # sent as a bearer token when set (vLLM's --api-key)
PROMPT_FIELDS = ("pid", "residue", "target_pos", "query_pos", "target_index", "mapping", "answer", "answer_word")


class EngineError(PhaseKVError):
    """The server cannot evaluate the model: unreachable, another model or tokenizer, no log-probabilities."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # HTTP status of the answer that failed (None: no answer)


class _Retry(Exception):
    """A failure worth retrying (connection error, 429, 5xx); its message is the one-line error if none works."""


@dataclass
class EngineConfig:
    url: str  # server address, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str  # the served model's name (vLLM's --served-model-name)
    top_logprobs: int = 20  # next-token log-probabilities asked per prompt (vLLM's default --max-logprobs)
    concurrency: int = 8  # requests in flight
    retries: int = 4  # further attempts after a connection error, HTTP 429 or 5xx
    backoff: float = 0.5  # seconds before the first retry, doubled at each further one (7.5 s for 4)
    timeout: float = 600.0  # seconds one request may take (long prompts queue behind others)

    def __post_init__(self):
        url = urllib.parse.urlparse(self.url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"--server {self.url!r}: expected an address like http://127.0.0.1:8000")
        if not self.model:
            raise ConfigError("--served-model is required with --server (the name the server serves the model by)")
        if self.top_logprobs < 1 or self.concurrency < 1 or self.retries < 0 or self.backoff < 0 or self.timeout <= 0:
            raise ConfigError(f"engine settings out of range: top_logprobs={self.top_logprobs}, concurrency="
                              f"{self.concurrency} (>= 1), retries={self.retries}, backoff={self.backoff} (>= 0), "
                              f"timeout={self.timeout} (> 0)")

    @property
    def base(self) -> str:
        """The address without a trailing / or /v1 (vLLM's /tokenize sits beside /v1)."""
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


class EngineClient:
    """JSON over HTTP to one server with the standard library, retried with exponential backoff."""

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg

    def call(self, path: str, payload: dict | None = None) -> dict:
        """GET (payload None) or POST `path`; the decoded JSON answer, or EngineError in one line."""
        attempt = 0
        while True:
            try:
                return self._once(self.cfg.base + path, payload)
            except _Retry as exc:
                if attempt == self.cfg.retries:
                    raise EngineError(str(exc)) from None
                time.sleep(self.cfg.backoff * 2**attempt)
                attempt += 1

    def _once(self, url: str, payload: dict | None) -> dict:
        headers = {"Content-Type": "application/json"}
        if os.environ.get(API_KEY_ENV):
            headers["Authorization"] = f"Bearer {os.environ[API_KEY_ENV]}"
        data = None if payload is None else json.dumps(payload).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=self.cfg.timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:
            message = f"{url}: HTTP {exc.code}: {_server_message(exc)}"
            if exc.code in RETRY_STATUS:
                raise _Retry(message) from None
            raise EngineError(message, exc.code) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError: refused, reset, timed out, cut short
            raise _Retry(f"cannot reach the server at {self.cfg.base} ({getattr(exc, 'reason', exc)})") from None
        try:
            return json.loads(body)
        except ValueError:
            raise EngineError(f"{url}: the answer is not JSON ({body[:80]!r})") from None

    def served(self) -> dict:
        """The served model's /v1/models entry (vLLM adds `root`, the directory it loaded, and `max_model_len`)."""
        models = [m for m in self.call("/v1/models").get("data") or [] if isinstance(m, dict)]
        for m in models:
            if m.get("id") == self.cfg.model:
                return m
        names = ", ".join(repr(m.get("id")) for m in models) or "none"
        raise EngineError(f"{self.cfg.base} serves no model named {self.cfg.model!r} (it serves {names}); "
                          "check --served-model")

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids of `text`, special tokens included (vLLM's /tokenize)."""
        try:
            out = self.call("/tokenize", {"model": self.cfg.model, "prompt": text, "add_special_tokens": True})
        except EngineError as exc:
            if exc.status != 404:
                raise
            raise EngineError(f"{self.cfg.base} has no /tokenize endpoint (vLLM's), so its tokenizer cannot be "
                              "checked against ours") from None
        return [int(i) for i in out.get("tokens") or []]

    def complete(self, prompts: list[list[int]], **options) -> list[dict]:
        """The choices of one completions request for `prompts` (token ids), in prompt order."""
        payload = {"model": self.cfg.model, "prompt": prompts, "max_tokens": 1, "temperature": 0,
                   "return_tokens_as_token_ids": True, **options}
        choices = sorted(self.call("/v1/completions", payload).get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise EngineError(f"{self.cfg.base}: {len(choices)} completions for {len(prompts)} prompts")
        return choices


def _server_message(exc: urllib.error.HTTPError) -> str:
    """The error text of an HTTP error answer (OpenAI style {"error": {"message"}} or vLLM's {"message"})."""
    body = exc.read().decode(errors="replace")
    try:
        data = json.loads(body)
        err = data.get("error", data)
        text = err.get("message", body) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        text = body or exc.reason
    return " ".join(str(text).split())[:300]


def _token_id(key: str) -> int:
    """123 from vLLM's "token_id:123" (tokens returned as ids)."""
    if isinstance(key, str) and key.startswith("token_id:") and key[len("token_id:"):].isdigit():
        return int(key[len("token_id:"):])
    raise EngineError(f"the server returned the token {key!r} instead of its id: it must support "
                      "`return_tokens_as_token_ids` (vLLM)")


def next_token_logprobs(choice: dict) -> dict[int, float]:
    """{token id: log-probability} of the top-k next tokens in one completion choice."""
    top = (choice.get("logprobs") or {}).get("top_logprobs") or []
    if not top or not top[0]:
        raise EngineError("the server returned no log-probabilities (it must honour `logprobs` in /v1/completions)")
    return {_token_id(k): float(v) for k, v in top[0].items()}


def prompt_logprob(choice: dict, position: int, token: int) -> float:
    """log P(prompt token at `position` = `token`) from a choice's prompt log-probabilities."""
    entries = choice.get("prompt_logprobs") or []
    entry = entries[position] if -len(entries) <= position < len(entries) else None
    value = entry.get(str(token)) if isinstance(entry, dict) else None  # vLLM: {"id": {"logprob", "rank", ...}}
    if not isinstance(value, dict) or "logprob" not in value:
        raise EngineError("the server returned no prompt log-probabilities (vLLM's `prompt_logprobs`)")
    return float(value["logprob"])


def top1(logprobs: dict[int, float]) -> int:
    """The most likely token, the lowest id among equals (torch's argmax picks the first maximum too)."""
    return min(logprobs, key=lambda t: (-logprobs[t], t))


@dataclass
class EngineModel(EvalModel):
    """A served model as an EvalModel: `model` is None and every forward pass is a request to the server."""

    client: EngineClient | None = None
    max_len: int | None = None  # the server's context limit (vLLM's max_model_len); None: unknown

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # where the run's own tensors live; the model's are on the server

    def score(self, prompts: Iterable[Prompt], protocol: str, batch_size: int = 32) -> Iterator[list[dict]]:
        """Rows of the prompts, a list per request, in the order the requests finish (runs sort by pid)."""
        for rows, appended in bounded(lambda b: self._score(b, protocol), batches(prompts, batch_size),
                                      self.client.cfg.concurrency):
            self.info["engine"]["answers_from_prompt_logprobs"] += appended
            self.info["engine"]["prompts"] += len(rows)
            yield rows

    def _score(self, batch: list[Prompt], protocol: str) -> tuple[list[dict], int]:
        """Rows of one request's prompts and how many answers needed the appended-answer request."""
        self._check_length(len(batch[0].ids) + 2)  # + the appended answer + the one generated token
        tops = [next_token_logprobs(c) for c in self.client.complete([p.ids for p in batch],
                                                                     logprobs=self.client.cfg.top_logprobs)]
        answer = [top.get(p.answer) for p, top in zip(batch, tops, strict=True)]  # log P(answer), None: not in top k
        missing = [i for i, lp in enumerate(answer) if lp is None]
        if missing:
            appended = self.client.complete([batch[i].ids + [batch[i].answer] for i in missing], prompt_logprobs=0)
            for i, choice in zip(missing, appended, strict=True):
                answer[i] = prompt_logprob(choice, -1, batch[i].answer)
        rows = []
        for p, top, lp in zip(batch, tops, answer, strict=True):
            pred = top1(top)
            rows.append({**{f: getattr(p, f) for f in PROMPT_FIELDS}, "pred": pred, "pred_word": self.tok.decode_id(pred),
                         "correct": pred == p.answer, "prob": math.exp(lp), "protocol": protocol})
        return rows, len(missing)

    def candidate_logprobs(self, ids: list[int], cands: list[list[int]]) -> list[float]:
        """log P(candidate | ids): the prompt log-probabilities of each candidate's tokens appended to ids."""
        self._check_length(len(ids) + max(len(c) for c in cands) + 1)
        choices = self.client.complete([ids + c for c in cands], prompt_logprobs=0)
        return [sum(prompt_logprob(ch, len(ids) + j, t) for j, t in enumerate(c))
                for ch, c in zip(choices, cands, strict=True)]

    def _check_length(self, need: int) -> None:
        if self.max_len is not None and need > self.max_len:
            raise ConfigError(f"requests of {need} tokens exceed the served model's max_model_len={self.max_len}; "
                              "lower records, filler or context, or serve it with a longer --max-model-len")


def batches(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def bounded(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """fn(item) for every item, at most `workers` calls in flight, results in the order the calls finish."""
    pending: set = set()
    with ThreadPoolExecutor(max_workers=workers) as ex:
        try:
            for item in items:
                pending.add(ex.submit(fn, item))
                if len(pending) >= workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in done)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        finally:
            for f in pending:
                f.cancel()


# ---------------------------------------------------------------- connecting


def connect(server: str, served_model: str, tokenizer: str | Path | None = None, trust_remote_code: bool = False,
            **settings) -> EngineModel:
    """The served model as an EvalModel, after the probe; `settings` are EngineConfig fields. The tokenizer and
    the run's evaluation metadata (`phasekv export`) come from `tokenizer` or the directory the server loaded."""
    cfg = EngineConfig(server, served_model, **settings)
    client = EngineClient(cfg)
    entry = client.served()
    source = _tokenizer_source(tokenizer, entry)
    tok = WordTokenizer(_load_tokenizer(source, trust_remote_code), str(source))
    probe(client, tok)
    model_dir = source if source.is_dir() else source.parent
    info = {"path": f"engine:{served_model}:{entry.get('root') or source}", "tokenizer": str(source),
            **{k: v for k, v in evaluation_info(model_dir).items() if v is not None},
            "engine": {"server": cfg.base, "served_model": served_model, "root": entry.get("root"),
                       "max_model_len": entry.get("max_model_len"), "top_logprobs": cfg.top_logprobs,
                       "prompts": 0, "answers_from_prompt_logprobs": 0}}
    info["ratios"] = hf_ratios(config_json(model_dir))  # every compression ratio of its config.json (V4: CSA, HCA)
    return EngineModel(None, tok, served_model, "engine", hf_stride(config_json(model_dir)), info,
                       client=client, max_len=entry.get("max_model_len"))


def probe(client: EngineClient, tok: WordTokenizer) -> None:
    """Fail before any prompt unless the server encodes a sample prompt to our ids and returns log-probabilities
    with token ids for it."""
    text = tok.text(word_list("animals")[:6] + word_list("names")[:6] + word_list("filler")[:6])
    ours, theirs = tok.encode(text), client.tokenize(text)
    if ours != theirs:
        k = next((j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
        raise EngineError(f"the server's tokenizer differs from {tok.name}: a sample prompt encodes to other ids from "
                          f"position {k} on (server {theirs[k:k + 3]}, ours {ours[k:k + 3]}; lengths {len(theirs)} "
                          f"and {len(ours)}); pass the served model's tokenizer with --tokenizer")
    next_token_logprobs(client.complete([ours], logprobs=client.cfg.top_logprobs)[0])


def _tokenizer_source(tokenizer: str | Path | None, entry: dict) -> Path:
    """--tokenizer, else the directory the server loaded (vLLM's `root`) when it is a directory here too."""
    if tokenizer is not None:
        return Path(tokenizer)
    root = entry.get("root")
    if root and Path(root).is_dir():
        return Path(root)
    raise ConfigError(f"the server loaded {root!r}, not a directory on this machine: pass --tokenizer DIR "
                      "(the served model's tokenizer files)")


def _load_tokenizer(source: Path, trust_remote_code: bool):
    """A tokenizer file (tokenizers JSON), or a model directory through transformers (as vLLM loads it)."""
    if not source.is_dir():
        return load_tokenizer(source)
    from transformers import AutoTokenizer  # slow import: only for directories

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: no loadable tokenizer ({' '.join(str(exc).split())[:200]})") from None

