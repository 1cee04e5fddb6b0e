"""The `phasekv` command line. Each room owns its commands and mounts them here."""

from __future__ import annotations

import sys

import typer

from phasekv.errors import PhaseKVError

app = typer.Typer(
    help="phasekv: find, explain and repair periodic weak spots of compressed-KV-cache language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _options(
    threads: int = typer.Option(
        None, "--threads", envvar="PHASEKV_THREADS",
        help="CPU threads for torch (default 1: on a shared 2-core machine more threads are often slower).",
    ),
) -> None:
    """phasekv: find, explain and repair periodic weak spots of compressed-KV-cache language models."""
    import torch

    from phasekv.runtime import reuse_freed_memory

    torch.set_num_threads(threads or 1)
    reuse_freed_memory()


def _mount() -> None:
    # one line per room; a room registers its commands on `app` (or a sub-app)
    from phasekv.analysis import cli as analysis_cli
    from phasekv.demo import cli as demo_cli
    from phasekv.eval import cli as eval_cli
    from phasekv.mitigate import cli as mitigate_cli
    from phasekv.model import cli as model_cli
    from phasekv.report import cli as report_cli
    from phasekv.theory import cli as theory_cli
    from phasekv.train import cli as train_cli

    model_cli.register(app)
    report_cli.register(app)
    demo_cli.register(app)
    app.add_typer(theory_cli.app, name="theory")
    app.add_typer(analysis_cli.app, name="analyze")
    app.add_typer(eval_cli.app, name="eval")
    eval_cli.register(app)  # export
    train_cli.register(app)  # train, sweep, tokenizer
    mitigate_cli.register(app)  # compare, audit
    mitigate_cli.register_analyze(analysis_cli.app)  # analyze lm-eval


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2 (`--debug` re-raises)."""
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    _mount()
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except (PhaseKVError, ValueError, OSError) as exc:
        if debug:
            raise
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
