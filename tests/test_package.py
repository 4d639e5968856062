"""Package wiring: the console script, lazy command loading and the native library version."""
import subprocess
import sys

from click.testing import CliRunner

import luce
from luce.binding import ffi, lib
from luce.cli.main import cli


def test_native_version_matches_package():
    assert ffi.string(lib().luce_version()).decode() == luce.__version__


def test_help_lists_every_command_without_loading_them():
    code = (
        "import sys; from luce.cli.main import cli; "
        "from click.testing import CliRunner; r = CliRunner().invoke(cli, ['--help']); "
        "assert r.exit_code == 0, r.output; "
        "assert not any(m.startswith(('numpy', 'luce.converters', 'luce.binding')) for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith(('numpy', 'luce')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_console_script_version(luce_cmd):
    out = luce_cmd("--version", check=True)
    assert out.stdout.strip() == f"luce, version {luce.__version__}"


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command" in result.output
