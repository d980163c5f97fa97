"""The suite's two pytest-xdist workers keep the tests that start vLLM servers and those that
start a Ray cluster on one worker, in turn (``tests/conftest.py``'s group, ``--dist
loadgroup``): run for real on a probe suite of marked tests, each writing the worker it ran
on."""

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PROBE = """
import os

import pytest


@pytest.mark.{mark}
@pytest.mark.parametrize("i", range(6))
def test_{mark}(i):
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write("{mark} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_free_{mark}(i):
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write("free " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_vllm_and_ray_tests_run_on_one_worker(tmp_path):
    for mark in ("vllm", "ray"):
        (tmp_path / f"test_{mark}_probe.py").write_text(PROBE.format(mark=mark))
    # The suite's own grouping hook, as tests/conftest.py defines it.
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite', {str(TESTS / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_itemcollected = suite.pytest_itemcollected\n"
    )
    out = tmp_path / "workers.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env={"PROBE_OUT": str(out),
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "24 passed" in done.stdout
    ran: dict[str, set[str]] = {}
    for line in out.read_text().splitlines():
        mark, worker = line.split()
        ran.setdefault(mark, set()).add(worker)
    assert len(ran["vllm"] | ran["ray"]) == 1  # the servers' group on one worker
    assert ran["free"] <= {"gw0", "gw1"}  # the others wherever there is room
