"""Operator-supplied files (sealgate/files.py): a FIFO where a file belongs is refused at once."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sealgate.credentials.keys import KeyFileError, Keyring
from sealgate.files import read_regular
from sealgate.issuer.callers import CallersFileError, load_callers
from sealgate.proxy.credentials.secrets import SecretRef, SecretUnavailable, open_store
from sealgate.proxy.policy.rulesfile import RulesError, load_rules


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path, 0o600)
    return path


@pytest.mark.timeout(10)
def test_read_regular_refuses_a_fifo_without_blocking(fifo: Path) -> None:
    with pytest.raises(OSError, match="not a regular file"):
        read_regular(fifo, 100)


def test_read_regular_reads_one_byte_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 50)
    data, st = read_regular(path, 10)
    assert (data, st.st_size) == (b"x" * 11, 50)


@pytest.mark.timeout(10)
def test_every_config_reader_refuses_a_fifo(fifo: Path, tmp_path: Path) -> None:
    with pytest.raises(RulesError, match=r"not a (regular )?file"):
        load_rules(fifo)
    with pytest.raises(CallersFileError, match="not a regular file"):
        load_callers(fifo)
    keys = tmp_path / "keys"
    keys.mkdir()
    os.mkfifo(keys / ("0" * 16 + ".key"), 0o600)
    with pytest.raises(KeyFileError, match="not a regular file"):
        Keyring.load(keys)


@pytest.mark.timeout(10)
def test_file_store_refuses_a_fifo(fifo: Path) -> None:
    store = open_store(f"file:{fifo}")
    with pytest.raises(SecretUnavailable, match="not a regular file"):
        asyncio.run(store.fetch(SecretRef("file", "x")))
