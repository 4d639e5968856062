"""docs/formats.md and docs/cli.md cover everything the schema and the inspect rules define."""
from __future__ import annotations

import re
from pathlib import Path

from luce.converters import schema

ROOT = Path(__file__).resolve().parents[1]
FORMATS = (ROOT / "docs" / "formats.md").read_text()
CLI = (ROOT / "docs" / "cli.md").read_text()


def test_every_drafter_key_is_documented():
    for name, key in schema.all_keys().items():
        if key.template.startswith("{arch}."):
            documented = key.template.replace("{arch}.", "A.") in FORMATS or \
                key.template.replace("{arch}.", "dflash.") in FORMATS
        else:
            documented = key.template in FORMATS
        assert documented, f"{name}: {key.template}"


def test_every_tensor_name_is_documented_in_both_layouts():
    for role in schema.ROLES:
        for template in (role.lucebox, role.upstream):
            assert template.replace("{bid}", "{i}") in FORMATS, template


def test_every_inspect_finding_code_is_documented():
    source = (ROOT / "converters" / "validate.py").read_text()
    codes = set(re.findall(r'(?:error|warn|severity)\("([a-z0-9-]+)"', source))
    assert len(codes) > 30
    for code in codes:
        assert f"`{code}`" in CLI, code
