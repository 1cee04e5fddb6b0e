"""A minimal inference server for the engine client's tests: the part of vLLM's OpenAI-compatible protocol that
`phasekv.eval.engine` uses (/v1/models, /tokenize, /v1/completions with token-id prompts, `logprobs`,
`prompt_logprobs`, `return_tokens_as_token_ids`), answered by a model in this process, on 127.0.0.1 only.
Knobs make it misbehave the ways a real server can: another tokenizer, no log-probabilities, no /tokenize,
token strings instead of ids, busy (HTTP 503) or failing (HTTP 400) answers."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class FakeEngine:
    def __init__(self, model: torch.nn.Module, tok, name: str = "tiny", root: str = "", max_len: int = 4096):
        self.model, self.tok, self.name, self.root, self.max_len = model, tok, name, root, max_len
        self.tokenize_with = tok  # another tokenizer: the server's disagrees with the client's
        self.has_tokenize = True
        self.logprobs = True  # False: completions come back without log-probabilities
        self.token_ids = True  # False: tokens come back as strings, whatever the request says
        self.prompt_logprobs = True  # False: `prompt_logprobs` is ignored
        self.authorization: str | None = None  # the last request's Authorization header
        self.busy = 0  # answer the next N completion requests with HTTP 503
        self.fail_after: int | None = None  # answer completion requests after the first N with HTTP 400
        self.delay = 0.0  # seconds each completion request takes (to see requests overlap)
        self.completions = 0  # completion requests answered
        self.prompts = 0  # prompts scored (with or without an appended answer)
        self.inflight = self.max_inflight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- the protocol
    def models(self) -> tuple[int, dict]:
        return 200, {"object": "list", "data": [{"id": self.name, "object": "model", "root": self.root,
                                                 "max_model_len": self.max_len}]}

    def tokenize(self, body: dict) -> tuple[int, dict]:
        if not self.has_tokenize:
            return 404, {"detail": "Not Found"}
        return 200, {"tokens": self.tokenize_with.encode(body["prompt"]), "max_model_len": self.max_len}

    def complete(self, body: dict) -> tuple[int, dict]:
        with self.lock:
            self.completions += 1
            n, busy, self.busy = self.completions, self.busy > 0, max(0, self.busy - 1)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            time.sleep(self.delay)
            if busy:
                return 503, _error("server busy", 503)
            if body.get("model") != self.name:
                return 404, _error(f"The model `{body.get('model')}` does not exist.", 404)
            if self.fail_after is not None and n > self.fail_after:
                return 400, _error("planted failure", 400)
            if any(len(ids) + body.get("max_tokens", 16) > self.max_len for ids in body["prompt"]):
                return 400, _error("prompt too long", 400)
            return 200, {"choices": [self.choice(i, ids, body) for i, ids in enumerate(body["prompt"])]}
        finally:
            with self.lock:
                self.inflight -= 1

    @torch.no_grad()
    def choice(self, index: int, ids: list[int], body: dict) -> dict:
        with self.lock:
            self.prompts += 1
            lp = torch.log_softmax(self.model(torch.tensor([ids])).float()[0], -1)  # (T, V)
        key = (lambda t: f"token_id:{t}") if self.token_ids and body.get("return_tokens_as_token_ids") else self.tok.decode_id
        out = {"index": index, "text": "", "logprobs": None, "prompt_logprobs": None}
        k = body.get("logprobs")
        if k is not None and self.logprobs:
            top = torch.topk(lp[-1], k)
            out["logprobs"] = {"tokens": [key(int(top.indices[0]))], "token_logprobs": [float(top.values[0])],
                               "top_logprobs": [{key(int(t)): float(v) for t, v in zip(top.indices, top.values, strict=True)}]}
        if body.get("prompt_logprobs") is not None and self.prompt_logprobs:
            out["prompt_logprobs"] = [None] + [{str(t): {"logprob": float(lp[j, t]), "rank": 1 + int((lp[j] > lp[j, t]).sum())}}
                                               for j, t in enumerate(ids[1:])]
        return out


def _error(message: str, code: int) -> dict:
    return {"error": {"message": message, "type": "Error", "code": code}}


def _handler(engine: FakeEngine):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.answer(*(engine.models() if self.path == "/v1/models" else (404, {"detail": "Not Found"})))

        def do_POST(self):
            engine.authorization = self.headers.get("Authorization")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            routes = {"/tokenize": engine.tokenize, "/v1/completions": engine.complete}
            self.answer(*(routes[self.path](body) if self.path in routes else (404, {"detail": "Not Found"})))

        def answer(self, status: int, data: dict) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):  # quiet
            pass

    return Handler
