"""Adding a processor is its module: the registry (`sealgate.credentials.processors`) finds a
type planted in a module of its own, with no registry line and no caller edited. In a child
process, over a copy of the base package, so the tree under test is never written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sealgate.credentials import processors

ROOT = Path(__file__).resolve().parents[2]
KINDS = frozenset(processors.PROCESSOR_TYPES)

ROT13 = '''
"""`x-rot13`: a processor planted by the test, in a module of its own and nowhere else."""

import codecs
from dataclasses import dataclass
from typing import ClassVar

from .base import FixedHeaderProcessor, check_verbatim_secret


@dataclass(frozen=True)
class Rot13Processor(FixedHeaderProcessor):
    kind: ClassVar[str] = "x-rot13"

    def check_secret(self, secret: str) -> None:
        check_verbatim_secret(secret, self.kind)

    @property
    def target(self) -> str:
        return "x-rot13"

    def describe(self) -> str:
        return "X-Rot13: rot13(<secret>)"

    def fixed_header(self, secret: str) -> tuple[str, str]:
        return "X-Rot13", codecs.encode(secret, "rot13")
'''

USE_IT = """
from sealgate.credentials import processors as pr
p = pr.processor_from_object({"type": "x-rot13"})
print(type(p).__name__, p.to_object(), p.fixed_header("secret"), p.describe(), p.target)
print(sorted(pr.PROCESSOR_TYPES) == sorted([*KINDS, "x-rot13"]))
"""


def test_a_new_processor_module_alone_is_registered(tmp_path: Path) -> None:
    # A copy of the base package (the library imports nothing else) with one module added:
    # no registry line, no caller edited.
    shutil.copytree(ROOT / "sealgate", tmp_path / "sealgate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "sealgate" / "credentials" / "processors" / "rot13.py").write_text(ROT13)
    script = f"KINDS = {sorted(KINDS)!r}\n" + USE_IT
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == ("Rot13Processor {'type': 'x-rot13'} ('X-Rot13', 'frperg') "
                     "X-Rot13: rot13(<secret>) x-rot13")
    assert second == "True"
