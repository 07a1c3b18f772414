"""The ring benchmark (``flashattn ring``) under torchrun, on 2 gloo processes at a tiny shape, both modes: its results
file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.xdist_group("ring-processes")  # test_distributed.py's spawning tests: one group of processes at a time
def test_ring_bench_under_torchrun_writes_its_results(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), FLASHATTN_BACKEND="torch", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "flashattn", "ring", "--seqlens", "67", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
               "--target-seconds", "0.05", "--min-iters", "2", "--torch-cp", "--mode", "ring", "all_to_all",
               # a busy machine (the GPU suite's workers) can take seconds over the warm-up: still time the iterations
               "--single-call-seconds", "120", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "cpux2-ring.json").read_text())
    assert data["environment"]["world_size"] == 2 and data["environment"]["backend"] == "gloo"
    rows = {(r["provider"], r["case"]["causal"]): r for r in data["results"]}
    providers = ("flashattn", "flashattn_ring", "flashattn_all_to_all", "torch_cp")
    assert set(rows) == {(p, c) for p in providers for c in (True, False)}
    for causal in (True, False):
        single = rows["flashattn", causal]
        assert single["devices"] == 1 and single["error"] is None
        for ring in (rows["flashattn_ring", causal], rows["flashattn_all_to_all", causal]):  # the two modes
            assert ring["devices"] == 2 and ring["case"]["seqlen"] == 67 and ring["error"] is None
            assert ring["ms"] > 0 and ring["iterations"] >= 2 and ring["tflops_per_device"] > 0
            assert ring["efficiency"] == pytest.approx(ring["tflops_per_device"] / single["tflops_per_device"])
        # torch's context parallelism either ran or says why not (it has no CPU attention to shard)
        cp = rows["torch_cp", causal]
        assert (cp["ms"] or 0) > 0 or cp["error"]
    assert "flashattn_ring" in result.stdout and "flashattn_all_to_all" in result.stdout


def test_document_lengths_fill_the_total_from_a_capped_long_tailed_draw():
    from flashattn.tools.bench_ring import DOCUMENT_CAP, document_lengths

    for total in (1, 4096, 262144):
        lengths = document_lengths(total)
        assert sum(lengths) == total and min(lengths) >= 1 and max(lengths) <= DOCUMENT_CAP
        assert document_lengths(total) == lengths  # seeded by the total
    lengths = document_lengths(262144)
    assert len(lengths) > 20 and max(lengths) > 4 * sorted(lengths)[len(lengths) // 2]  # a long tail


def test_packed_cases_count_the_documents_flops_and_long_calls_are_timed_once(tmp_path, monkeypatch):
    """In-process, one gloo rank: ``--packed`` times the varlen calls on a drawn batch, and a case whose warm-up
    exceeds ``--single-call-seconds`` is measured by that call alone."""
    import torch.distributed as dist

    from flashattn import flops
    from flashattn.tools import bench_ring

    monkeypatch.setenv("FLASHATTN_BACKEND", "torch")
    parser = __import__("argparse").ArgumentParser()
    bench_ring.add_arguments(parser)
    args = parser.parse_args(["--packed", "--seqlens", "300", "--causal", "yes", "--heads", "2", "--kv-heads", "1",
                              "--head-dim", "16", "--mode", "ring", "all_to_all", "--single-call-seconds", "0",
                              "--out", str(tmp_path)])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        written = []
        rows = bench_ring.run_cases(args, __import__("torch").device("cpu"), written.append)
    finally:
        dist.destroy_process_group()
    assert [r.provider for r in rows] == ["flashattn", "flashattn_ring", "flashattn_all_to_all"] and written
    case = rows[0].case
    assert case.documents == bench_ring.document_lengths(300) and sum(case.documents) == 300
    expected = sum(flops.forward_flops(1, n, n, 2, 16, True) + flops.backward_flops(1, n, n, 2, 16, True)
                   for n in case.documents)
    assert case.flops() == pytest.approx(expected)
    for row in rows:
        assert row.error is None and row.iterations == 1 and row.extra == {"one_call": True}
    assert rows[1].efficiency == pytest.approx(rows[1].tflops_per_device / rows[0].tflops_per_device)
