"""phasekv's position-matched tests as lm-evaluation-harness tasks, and lm-eval's per-sample logs read back.

`export_tasks` writes one task per test into a directory that `lm_eval --include_path DIR` reads:
`phasekv_lookup_prefix`, `phasekv_lookup_inseq`, `phasekv_needle`. Each is TASK.yaml (a task config, written
as JSON, which YAML reads) and TASK.jsonl (one document per prompt: its text exactly as `phasekv eval` builds
it, the answer word and token, the residue, target and query positions, mapping and target record). The
config's `metadata.phasekv` holds the prompt config and the design, so a results directory alone says how to
summarise it.

Scoring is lm-eval's `loglikelihood` of the answer word after the prompt: lm-eval returns (log P, is_greedy),
and is_greedy of a one-token continuation is argmax over the full vocabulary at the query position == the
answer's token: the study's full-vocabulary top-1, with no decoding and no whitespace to strip. Placement:
lm-eval tokenises the context as the tokenizer does by default (special tokens added, as phasekv does), and
scores context + " " + answer split after the context's tokens; `export_tasks` checks, for every prompt, that
this gives phasekv's ids and the answer as exactly one token, and fails with one line for a tokenizer where it
does not.

`read_samples` turns `lm_eval ... --log_samples --output_path OUT` back into phasekv's per-prompt rows, and
`summarize_scored` writes a task's results.parquet, summary.json and accuracy.png exactly as `phasekv eval` does
(`phasekv.eval.run.write_run`); `phasekv.mitigate.audit.audit_scored` gives the audit's verdict of it. The model type lm-eval scores phasekv's own models with is
`phasekv.eval.lm_model` (it imports lm-eval; this module only to read model arguments lm-eval was given as a string).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from phasekv.errors import ConfigError, DataError
from phasekv.eval.models import EvalModel, config_json, evaluation_info, hf_ratios, hf_stride
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts
from phasekv.eval.protocols import protocol
from phasekv.eval.run import COLUMNS, json_default, write_run
from phasekv.io import write_json, write_text


@dataclass(frozen=True)
class Task:
    """One exported test: lm-eval's task name, phasekv's protocol and its padding."""

    name: str  # lm-eval task name (`--tasks NAME`)
    protocol: str  # phasekv.eval.protocols name: lookup | needle
    padding: str  # prefix | in-sequence


TASKS = {t.name: t for t in (Task("phasekv_lookup_prefix", "lookup", "prefix"),
                             Task("phasekv_lookup_inseq", "lookup", "in-sequence"),
                             Task("phasekv_needle", "needle", "in-sequence"))}
SAMPLES = "samples_{task}_*.jsonl"  # lm-eval's per-sample log of a task (under OUT/<model>/)


def task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown phasekv task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[name]


def export_tasks(em: EvalModel, out: str | Path, names: list[str] | None = None, context: int | None = None,
                 **options) -> dict[str, dict]:
    """Write the tasks `names` (default: all) for `em`'s tokenizer and training data into `out`; returns each
    task's metadata. The prompts are the protocol's own (`Protocol.fit`: the words a recall run was trained
    on, a layout that fits it; the needle at `context` tokens); options (per_group, modulus, records, demos,
    filler, mappings, seed, keep_n) that are None are the protocol's defaults. Every prompt is built and checked
    before a file is written."""
    out = Path(out).resolve()
    built = {}
    for name in names or list(TASKS):
        t = task(name)
        fit = protocol(t.protocol).fit
        cfg = fit(em, context=context, padding=t.padding, **options)
        prompts = RetrievalPrompts(cfg, em.tok)
        docs = [_document(p, prompts) for p in prompts]
        built[name] = (prompts.metadata(), docs)
    out.mkdir(parents=True, exist_ok=True)
    metas = {}
    for name, (meta, docs) in built.items():
        data = out / f"{name}.jsonl"
        write_text(data, "".join(json.dumps(d) + "\n" for d in docs))
        metas[name] = {"task": TASKS[name].protocol, "interval": protocol(TASKS[name].protocol).interval,
                       "prompts": meta, "built_for": em.name}
        write_json(out / f"{name}.yaml", task_config(name, data, metas[name]), default=json_default)
    return metas


def task_config(name: str, data: Path, meta: dict) -> dict:
    """lm-eval's config of a task over the documents in `data`: the prompt text as the context, the document's
    target (" " + the answer word: lm-eval puts no delimiter before a loglikelihood target) as the
    continuation, `acc` = is_greedy (top-1)."""
    return {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test", "output_type": "loglikelihood", "doc_to_text": "text",
            "doc_to_target": "target",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {"version": 1.0, "phasekv": meta}}


def _document(p, prompts: RetrievalPrompts) -> dict:
    """A prompt as an lm-eval document; fails (one line) where lm-eval's split of text + " " + answer would not
    give the prompt's ids followed by the answer's one token."""
    tok = prompts.tok
    text = tok.text(p.words)
    whole = tok.encode(text + " " + p.answer_word)
    if whole[: len(p.ids)] != p.ids or whole[len(p.ids):] != [p.answer]:
        raise DataError(f"tokenizer {tok.name}: prompt {p.pid}'s text followed by ' {p.answer_word}' tokenises to "
                        f"{len(whole)} tokens, not its {len(p.ids)} ids and the answer's one token, so lm-eval "
                        "could not score it token-exactly (its residues would shift)")
    return {"pid": p.pid, "residue": p.residue, "mapping": p.mapping, "target_pos": p.target_pos,
            "query_pos": p.query_pos, "target_index": p.target_index, "answer": p.answer,
            "answer_word": p.answer_word, "padding": prompts.cfg.padding, "length": len(p.ids), "text": text,
            "target": " " + p.answer_word}


# ---------------------------------------------------------------- reading lm-eval's output back


@dataclass
class Scored:
    """One phasekv task as lm-eval scored it: the rows `phasekv eval` would have written, its metadata, the
    model lm-eval ran."""

    name: str  # lm-eval task name
    rows: pd.DataFrame  # COLUMNS, one row per prompt (pred -1: lm-eval's loglikelihood names no prediction)
    meta: dict  # the task config's metadata.phasekv (export_tasks)
    model: EvalModel  # what lm-eval ran (no weights in process: name, kind "lm-eval", stride, info)
    samples: Path  # the samples file read
    seconds: float  # lm-eval's evaluation time (every task of its run together)

    @property
    def config(self) -> PromptConfig:
        """The prompts' config as exported."""
        return PromptConfig(**self.meta["prompts"]["prompt_config"])


def read_samples(output: str | Path, stride: int | None = None) -> list[Scored]:
    """Every phasekv task of `lm_eval ... --log_samples --output_path OUTPUT` (the newest run of each), checked:
    every exported prompt scored once, its context the exported text unchanged (no few-shot examples, chat
    template or system prompt before it: those would shift every position)."""
    output = Path(output)
    if not output.is_dir():
        raise ConfigError(f"{output}: not a directory (the --output_path of an lm_eval run with --log_samples)")
    found = []
    for name in TASKS:
        files = sorted(output.rglob(SAMPLES.format(task=name)), key=lambda f: f.name)  # names end in the date
        if files:
            found.append(_read_task(name, files[-1], stride))
    if not found:
        raise ConfigError(f"{output}: no samples of a phasekv task (samples_phasekv_*.jsonl); run lm_eval with "
                          "--log_samples --output_path and the tasks of `phasekv export-tasks`")
    return found


def _read_task(name: str, samples: Path, stride: int | None) -> Scored:
    results = _results_for(samples)
    config = results.get("configs", {}).get(name)
    if not isinstance(config, dict) or "phasekv" not in (config.get("metadata") or {}):
        raise DataError(f"{samples}: its results file has no phasekv metadata for {name} (tasks not exported "
                        "by `phasekv export-tasks`?)")
    meta = config["metadata"]["phasekv"]
    rows = []
    for i, line in enumerate(samples.read_text(encoding="utf-8").splitlines()):
        s = json.loads(line)
        doc, args = s["doc"], s["arguments"]["gen_args_0"]
        if args["arg_0"] != doc["text"] or args["arg_1"] != doc["target"]:
            raise DataError(f"{samples}:{i + 1}: lm-eval scored another context than the exported prompt "
                            f"{doc['pid']} (few-shot examples, a chat template or a system prompt shift every "
                            "position: run without them)")
        logprob = float(s["resps"][0][0][0])  # lm-eval's sample log writes each response as a string ("-6.47")
        rows.append({**{k: doc[k] for k in ("pid", "residue", "target_pos", "query_pos", "target_index",
                                            "mapping", "answer", "answer_word")},
                     "pred": -1, "pred_word": "", "correct": bool(s["acc"]), "prob": math.exp(logprob),
                     "protocol": doc["padding"]})  # acc: the task's metric, is_greedy (`task_config`)
    df = pd.DataFrame(rows, columns=COLUMNS).sort_values("pid").reset_index(drop=True)
    n = meta["prompts"]["n_prompts"]
    if df["pid"].nunique() != len(df) or len(df) != n:
        raise DataError(f"{samples}: {len(df)} samples of {n} prompts ({df['pid'].nunique()} distinct; "
                        "--limit or an interrupted run?)")
    seconds = float(results.get("total_evaluation_time_seconds") or 0.0)
    return Scored(name, df, meta, scored_model(results, stride), samples, seconds)


def _results_for(samples: Path) -> dict:
    """The results_*.json written with a samples file (same directory and date)."""
    date = samples.stem.rsplit("_", 1)[-1]
    path = samples.with_name(f"results_{date}.json")
    if not path.is_file():
        raise DataError(f"{samples}: no {path.name} beside it (lm-eval writes both)")
    return json.loads(path.read_text(encoding="utf-8"))


def scored_model(results: dict, stride: int | None = None) -> EvalModel:
    """The model an lm-eval run scored, as far as its results say: phasekv's model type reports its name,
    stride and provenance (`phasekv.eval.lm_model`); a local Hugging Face directory (`pretrained=DIR`) is read
    for its compression ratios and an export's training length. `stride` replaces the model's."""
    config = results.get("config", {})
    own = config.get("phasekv")
    if isinstance(own, dict):
        name, info, s = own["name"], own["info"], own["stride"]
    else:
        args = config.get("model_args") or {}  # a dict (lm-eval's command line), or the "k=v,k=v" string it was given
        if isinstance(args, str):
            from lm_eval.utils import simple_parse_args_string  # lm-eval's own parser (the lm-eval extra)

            args = simple_parse_args_string(args)
        path = Path(str(args["pretrained"])) if args.get("pretrained") else None
        hf = config_json(path) if path is not None and path.is_dir() else {}
        name = f"{config.get('model', 'lm-eval')}:{path.name if path else config.get('model_name', '?')}"
        info = {"path": str(path), **{k: v for k, v in evaluation_info(path).items() if v is not None},
                "ratios": hf_ratios(hf)} if hf else {}
        s = hf_stride(hf) if hf else None
    info = {**info, "lm_eval": {"model": config.get("model"), "model_args": config.get("model_args"),
                                "version": results.get("lm_eval_version")}}
    return EvalModel(None, None, name, "lm-eval", stride if stride is not None else s, info)


def summarize_scored(s: Scored, out: Path, stride: int | None = None) -> dict:
    """One scored task's evaluation directory (`write_run`: the summary `phasekv eval` writes), at the task's
    interval, its period test at `stride` (default: its model's)."""
    extra = {"lm_eval": {"task": s.name, "samples": str(s.samples)}}
    return write_run(out, s.rows, s.meta["task"], s.model, s.config, s.meta["prompts"],
                     s.model.stride if stride is None else stride, s.meta["interval"], s.seconds, 1, extra)
