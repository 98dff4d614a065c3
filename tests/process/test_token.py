"""Key generation in a child process whose disk is full."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_generate_on_a_full_disk_leaves_no_key_file(tmp_path: Path) -> None:
    # A child process whose file-size limit is 0 bytes: every write fails as on a full disk.
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from sealgate.credentials import keys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
        "try:\n"
        "    keys.generate(Path(sys.argv[1]))\n"
        "except keys.KeyFileError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
        timeout=30, cwd=Path(__file__).resolve().parents[2], check=True,
    ).stdout
    assert out.startswith("refused: cannot write key files")
    assert list(tmp_path.iterdir()) == []
