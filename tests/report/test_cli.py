import subprocess
import sys


def test_report_cli_error_is_one_line(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "phasekv", "report", str(tmp_path / "nope")], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error:") and "no such study directory" in bad.stderr
    assert "Traceback" not in bad.stderr
