"""FLASHATTN_TEST_SHARD (tests/conftest.py): the parts of a run partition its tests, and a bad value is refused."""

import types

import conftest
import pytest


def kept(shard: str, nodeids: list[str], monkeypatch) -> tuple[list[str], list[str]]:
    """The ids that conftest's collection hook keeps under ``shard``, and those it reports deselected."""
    monkeypatch.setenv("FLASHATTN_TEST_SHARD", shard)
    deselected: list[str] = []
    hook = types.SimpleNamespace(pytest_deselected=lambda items: deselected.extend(i.nodeid for i in items))
    items = [types.SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]
    conftest._keep_shard(types.SimpleNamespace(hook=hook), items)
    return [item.nodeid for item in items], deselected


def test_parts_partition_the_tests(monkeypatch):
    nodeids = [f"tests/test_{name}.py::test_case[{i}]" for name in ("kernels", "varlen") for i in range(40)]
    for count in (2, 5):
        parts = [kept(f"{i}/{count}", nodeids, monkeypatch) for i in range(1, count + 1)]
        assert sorted(sum((part for part, _ in parts), [])) == sorted(nodeids)
        assert all(part for part, _ in parts), "each part got some of the tests"
        for part, deselected in parts:
            assert sorted(part + deselected) == sorted(nodeids)


@pytest.mark.parametrize("shard", ["4/3", "0/2", "a/b", "1"])
def test_bad_shard_is_refused(shard, monkeypatch):
    with pytest.raises(pytest.UsageError, match="FLASHATTN_TEST_SHARD must be i/n"):
        kept(shard, ["tests/test_x.py::test_a"], monkeypatch)
