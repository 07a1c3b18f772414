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
               "--out", str(tmp_path)]
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
