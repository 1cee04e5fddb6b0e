"""`phasekv analyze` through typer's runner with small prompt settings, shared by the analysis tests."""

from typer.testing import CliRunner

from phasekv.analysis.cli import app

SMALL = ["--records", "12", "--demos", "2", "--modulus", "8", "--per-group", "6", "--keep-n", "--filler", "12",
         "--mappings", "3", "--no-progress"]


def invoke(args):
    res = CliRunner().invoke(app, args + SMALL)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    assert res.exit_code == 0, res.output
    return res
