"""FLASHATTN_TEST_SHARD (tests/conftest.py): the parts of a run partition its tests, and a bad value is refused."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(shard: str | None, target: str = "tests/test_combine.py") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["src", "tests", os.environ.get("PYTHONPATH", "")]))
    env.pop("FLASHATTN_TEST_SHARD", None)
    if shard is not None:
        env["FLASHATTN_TEST_SHARD"] = shard
    return subprocess.run([sys.executable, "-m", "pytest", target, "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def ids_of(run: subprocess.CompletedProcess) -> list[str]:
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_parts_partition_the_tests():
    everything = ids_of(collected(None))
    parts = [ids_of(collected(f"{i}/2")) for i in (1, 2)]
    assert sorted(sum(parts, [])) == sorted(everything) and len(everything) > 3
    assert all(parts), "each part got some of the tests"


def test_bad_shard_is_refused():
    run = collected("4/3")
    assert run.returncode != 0 and "FLASHATTN_TEST_SHARD must be i/n" in run.stdout + run.stderr
