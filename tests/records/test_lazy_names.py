"""p2ptrain.records names every record at its top, imported on first use (records/__init__.py):
each exported name resolves to the object its home module defines, and importing one record
module does not import the others."""

from __future__ import annotations

import importlib
import subprocess
import sys

import p2ptrain.records as records


def test_every_exported_name_resolves_to_its_home_modules_object() -> None:
    assert set(records.__all__) == set(records._HOMES)
    for name, home in records._HOMES.items():
        module = importlib.import_module(f"p2ptrain.records.{home}")
        assert getattr(records, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        records.NoSuchRecord  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchRecord" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_importing_the_fields_loads_no_record() -> None:
    script = (
        "import sys, p2ptrain.records.fields; "
        "print(sorted(m for m in sys.modules if m.startswith('p2ptrain.records.')))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    # multiaddrs.py is the fields' multiaddr check, no record
    assert out.stdout.strip() == "['p2ptrain.records.fields', 'p2ptrain.records.multiaddrs']"
