"""The supported torch range is tested at both ends: CI's second run installs the floor that
pyproject.toml declares, and speedrun's launch uses nothing that only part of the range has."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_tests_the_declared_floor():
    floor = re.search(r'"torch>=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text()).groups()
    ci = re.search(r"^FLOOR_TORCH=(\d+)\.(\d+)\.\d+$", (REPO / ".ci/run").read_text(), re.M).groups()
    assert ci == floor
    assert 'TORCH_VERSION="$FLOOR_TORCH" bash scripts/test.sh' in (REPO / ".ci/run").read_text()


def test_the_pin_is_inside_the_range():
    floor = tuple(map(int, re.search(r'"torch>=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text()).groups()))
    pin = re.search(r"^PINNED_TORCH=(\d+)\.(\d+)\.(\d+)$", (REPO / "scripts/setup_env.sh").read_text(), re.M)
    assert tuple(map(int, pin.groups()[:2])) >= floor


def test_speedrun_passes_no_torchrun_flag_of_part_of_the_range():
    """torchrun 2.9 rejects --signals-to-handle and 2.11 --shutdown-timeout ("unrecognized
    arguments"): the launch line names neither (their environment forms are read or ignored)."""
    launch = (REPO / "scripts/speedrun_lib.sh").read_text().split("launch() {", 1)[1].split("\n}\n", 1)[0]
    command = [line for line in launch.splitlines() if "exec torchrun" in line]
    assert len(command) == 1
    assert "--signals-to-handle" not in command[0] and "--shutdown-timeout" not in command[0]
