"""A sandbox launch line run for real: it joins its groups before the command, and goes no
further once its launcher is gone."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sealgate.sandbox.host.launch import Launch
from sealgate.sandbox.tiers.bwrap import argv
from tests.unit.test_sandbox_parts import LINK


def test_the_launch_joins_every_group_before_it_runs_anything(tmp_path: Path) -> None:
    groups = [tmp_path / "a", tmp_path / "b"]
    for group in groups:
        group.mkdir()
        (group / "cgroup.procs").write_text("")
    launch = Launch(LINK, ["true"], 3128, {}, b"")
    line = argv(launch, 10, groups)
    script = line[: line.index("--", line.index(str(groups[-1]))) + 1]
    done = subprocess.run([*script, "sh", "-c", "cat " + " ".join(
        str(g / "cgroup.procs") for g in groups)], capture_output=True, text=True, timeout=10)
    # Each group was written before the command ran (a real cgroup.procs takes "0": the writer).
    assert (done.returncode, done.stdout) == (0, "0\n0\n")
    (groups[1] / "cgroup.procs").unlink()
    (groups[1] / "cgroup.procs").mkdir()  # cannot be written: nothing runs
    failed = subprocess.run([*script, "sh", "-c", "echo ran"], capture_output=True, text=True,
                            timeout=10)
    assert failed.returncode == 125 and "ran" not in failed.stdout


def test_a_launch_whose_launcher_is_gone_goes_no_further(tmp_path: Path) -> None:
    """Once its parent-death signal is armed, the launch checks its parent is still the
    process that built the line: one started by another (as one orphaned before the signal
    was armed is, by pid 1) stops there, before it joins a group or runs anything."""
    group = tmp_path / "a"
    group.mkdir()
    (group / "cgroup.procs").write_text("")
    line = argv(Launch(LINK, ["true"], 3128, {}, b""), 10, [group])
    script = line[: line.index("--", line.index(str(group))) + 1]
    command = [*script, "sh", "-c", "echo ran"]
    ours = subprocess.run(command, capture_output=True, text=True, timeout=10)
    assert (ours.returncode, ours.stdout) == (0, "ran\n")
    (group / "cgroup.procs").write_text("")
    # The same line, started by a shell of its own rather than by this process.
    other = subprocess.run(["sh", "-c", '"$@"; exit $?', "sh", *command], capture_output=True,
                           text=True, timeout=10)
    assert (other.returncode, other.stdout) == (125, "")
    assert (group / "cgroup.procs").read_text() == ""
