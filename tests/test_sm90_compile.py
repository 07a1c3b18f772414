"""The tile table's kernels compiled for sm90 on the CPU (Triton's MLIR pipeline and the ptxas it ships),
as the launcher specializes them for the benchmark grid's shapes: ptxas must keep every kernel's wgmma
instructions asynchronous. When it serializes them (its info C7515) a kernel loses up to half its speed with
no other sign: the causal hdim-128 dK/dV kernel did (docs/perf-notes.md).

The compiles also check the table's TMA builds (forward; dK/dV at hdim 128 and 256 causal; dQ at hdim 256)
and the Hopper kernels' entries ("forward_hopper", "dkdv_hopper", "dq_hopper"), which the interpreter cannot run: a
descriptor path that Triton fails to compile runs fine there, and Gluon has no interpreter. And no build may read a
uniform register that some path leaves unwritten (benchmarks/sass_uniform_reads.py): a ptxas fault that made the
two-Q-tile Hopper forward read another tile's Q.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from flashattn.configs import HOPPER_SHARED_BYTES

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("forward", "forward_hopper", "dkdv", "dkdv_hopper", "dq", "dq_hopper")
HEAD_DIMS = (64, 128, 256)
# Each build costs a child's seconds of ptxas. Where a GPU is (the GPU suite, which every kernel change passes) or
# FLASHATTN_ALL_SM90_COMPILES=1, every build below runs; elsewhere (CI, two cores) a covering subset of each list:
# every kernel and kernel form, with and without the causal mask, each head dim in several kernels.
ALL_BUILDS = torch.cuda.is_available() or os.environ.get("FLASHATTN_ALL_SM90_COMPILES") == "1"


def builds(every, chosen: list):
    """``every`` (a list of builds, or a dict of them by name) where every build runs, else the ``chosen`` builds (or
    names) of it."""
    assert all(case in every for case in chosen)
    if ALL_BUILDS:
        return every
    return {name: every[name] for name in chosen} if isinstance(every, dict) else chosen


# the table's builds: in the covering subset each phase without and with the mask, at head dims chosen so that each is
# built in four phases (the Hopper dK/dV kernel has causal entries at hdim 256 only, the Hopper dQ none at hdim 64)
TABLE_BUILDS = builds([(phase, head_dim, causal) for phase in PHASES for head_dim in HEAD_DIMS
                       for causal in (False, True)],
                      [("forward", 64, False), ("forward", 128, True), ("forward_hopper", 128, False),
                       ("forward_hopper", 256, True), ("dkdv", 256, False), ("dkdv", 64, True),
                       ("dkdv_hopper", 64, False), ("dkdv_hopper", 256, True), ("dq", 64, False), ("dq", 128, True),
                       ("dq_hopper", 256, False), ("dq_hopper", 128, True)])
# the compiles run in a child process (_compiled): under TRITON_INTERPRET=1 the kernels are interpreter functions. One
# test a group of four builds: parallel workers (pytest-xdist) share the groups out, each build built once
COMPILE_BUILDS = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import sass_report
for phase, head_dim, causal in {builds!r}:
    print(json.dumps([sass_report.table_report(phase, head_dim, causal, seqlen=4096)]), flush=True)
"""


def groups(items: list, size: int = 4) -> list[tuple]:
    """``items`` ``size`` at a time (the last group what is left)."""
    return [tuple(items[i:i + size]) for i in range(0, len(items), size)]


# Hopper dK/dV tiles outside the table that the sweeps and the GPU tests use: 128 keys a program in both of the
# kernel's forms (gradient split and key slices), so that a change that breaks their compile shows in CI
_TILE_128_KEYS = dict(block_n=128, num_warps=8, hopper=True)
# (in CI the gradient-split form; the key-slice form is the table's hdim-64 build)
SWEPT_DKDV_TILES = builds({  # name -> (head dim, causal, TileConfig fields)
    "gradient-split 32x128x8x3, hdim 128": (128, False, dict(_TILE_128_KEYS, block_m=32, num_stages=3)),
    "key slices 64x128x8x2, hdim 64 causal": (64, True,
                                              dict(_TILE_128_KEYS, block_m=64, num_stages=2, key_slices=True)),
    "key slices 32x128x8x3, hdim 128": (128, False, dict(_TILE_128_KEYS, block_m=32, num_stages=3, key_slices=True)),
}, ["gradient-split 32x128x8x3, hdim 128"])
# the key-slice kernel's form with dQ fused (kernels/backward_fused_dq.py): the hdim-128 tile (the consumers' head-dim
# halves) and the hdim-64 ones (dQ^T in turns; 128-row query blocks on the persistent grid only), causal or not, and
# their persistent form (kernels/backward_fused_dq_persistent.py); in CI the table's at each head dim from 1k
_FUSED_DQ = dict(_TILE_128_KEYS, block_m=64, num_stages=2, key_slices=True)
_FUSED_DQ_64 = dict(_FUSED_DQ, block_m=128)
SWEPT_FUSED_DQ_TILES = builds({
    "fused dQ 64x128x8x2, hdim 128": (128, False, _FUSED_DQ),
    "fused dQ 64x128x8x2, hdim 128 causal": (128, True, _FUSED_DQ),
    "fused dQ 64x128x8x2, hdim 64": (64, False, _FUSED_DQ),
    "fused dQ 64x128x8x2, hdim 64 causal": (64, True, _FUSED_DQ),
    "fused dQ persistent 64x128x8x2, hdim 128": (128, False, dict(_FUSED_DQ, persistent=True)),
    "fused dQ persistent 64x128x8x2, hdim 128 causal": (128, True, dict(_FUSED_DQ, persistent=True)),
    "fused dQ persistent 128x128x8x2, hdim 64": (64, False, dict(_FUSED_DQ_64, persistent=True)),
    "fused dQ persistent 128x128x8x2, hdim 64 causal": (64, True, dict(_FUSED_DQ_64, persistent=True)),
    "fused dQ persistent 64x128x8x2, hdim 64": (64, False, dict(_FUSED_DQ, persistent=True)),
    "fused dQ persistent 64x128x8x2, hdim 64 causal": (64, True, dict(_FUSED_DQ, persistent=True)),
}, ["fused dQ 64x128x8x2, hdim 128", "fused dQ persistent 128x128x8x2, hdim 64 causal"])
# and Hopper dQ tiles outside the table: three consumer warpgroups (192 query rows a program), swept at hdim 64
_THREE_CONSUMERS_DQ = dict(block_m=128, block_n=64, num_warps=8, num_stages=3, hopper=True, three_consumers=True)
SWEPT_DQ_TILES = builds({"three consumers 128x64x8x3, hdim 64": (64, False, _THREE_CONSUMERS_DQ),
                         "three consumers 128x64x8x3, hdim 64 causal": (64, True, _THREE_CONSUMERS_DQ)},
                        ["three consumers 128x64x8x3, hdim 64 causal"])
# and the persistent Hopper forward with tiles handed out by a counter (causal, varlen: forward_hopper._next_tile)
_PERSISTENT = dict(block_m=128, block_n=128, num_warps=8, num_stages=2, hopper=True, persistent=True)
SWEPT_FORWARD_TILES = builds({  # name -> (head dim, causal, varlen, TileConfig fields)
    "persistent 128x128x8x2, hdim 128 causal": (128, True, False, _PERSISTENT),
    "persistent 128x128x8x2, hdim 128 varlen": (128, False, True, _PERSISTENT),
    "persistent three consumers 128x128x8x3, hdim 64 causal": (64, True, False,
                                                                dict(_PERSISTENT, num_stages=3, three_consumers=True)),
    # one consumer a 64-row tile, two programs an SM (launch.forward.programs_per_sm)
    "persistent one consumer 64x64x4x2, hdim 128 causal": (128, True, False,
                                                          dict(_PERSISTENT, block_m=64, block_n=64, num_warps=4)),
    "persistent one consumer 64x128x4x2, hdim 64 causal": (64, True, False,
                                                          dict(_PERSISTENT, block_m=64, num_warps=4)),
}, ["persistent 128x128x8x2, hdim 128 varlen", "persistent three consumers 128x128x8x3, hdim 64 causal",
    "persistent one consumer 64x64x4x2, hdim 128 causal"])
# the one-consumer builds' registers at launch and shared memory: two programs an SM
TWO_PROGRAM_FORWARDS = {"persistent one consumer 64x64x4x2, hdim 128 causal",
                        "persistent one consumer 64x128x4x2, hdim 64 causal"}
# four swept tiles a child, as the table's builds: report(head dim, causal, tile[, varlen])
SWEPT_BUILDS = {**{name: ("hopper_dkdv_report", head_dim, causal, fields, None)
                   for name, (head_dim, causal, fields) in SWEPT_DKDV_TILES.items()},
                **{name: ("hopper_dkdv_dq_report", head_dim, causal, fields, None)
                   for name, (head_dim, causal, fields) in SWEPT_FUSED_DQ_TILES.items()},
                **{name: ("hopper_forward_report", head_dim, causal, fields, varlen)
                   for name, (head_dim, causal, varlen, fields) in SWEPT_FORWARD_TILES.items()},
                **{name: ("hopper_dq_report", head_dim, causal, fields, None)
                   for name, (head_dim, causal, fields) in SWEPT_DQ_TILES.items()}}
COMPILE_SWEPT = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import sass_report
from flashattn.configs import TileConfig
for report, head_dim, causal, fields, varlen in {builds!r}:
    extra = {{}} if varlen is None else {{"varlen": varlen}}
    result = getattr(sass_report, report)(head_dim, causal, TileConfig(**fields), **extra)
    print(json.dumps([result]), flush=True)
"""


# sass_report's count of reads of a uniform register that a path leaves unwritten (benchmarks/sass_uniform_reads.py):
# ptxas 12.8 built the two-Q-tile Hopper forward that way, and it read another tile's Q (docs/perf-notes.md)
UNWRITTEN_READS = "ptxas reads a uniform register (a wgmma descriptor?) that a path leaves unwritten"
TMA_REDUCTION = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group"
TILE_COUNTER = "atom.global.gpu.relaxed.add.u32"  # a persistent grid's tiles taken (forward_hopper._next_tile)


def check_dq_reductions(name: str, result: dict, head_dim: int, causal: bool, block_m: int = 64) -> None:
    """No per-element global reduction in a dK/dV build; the fused dK/dV/dQ kernel adds dQ^T by TMA tile reductions
    (hdim 128: one a consumer in its loop, the previous block's, and causal in the one-tile kernel one in each of
    its two loops, the masked blocks' and those out of the mask's reach, whose loop holds no select, and one after
    them, the walk's last block's; hdim 64: those of a turn in each
    consumer's loop of two blocks, consumer 0's in an odd last block, and in the persistent form consumer 1's in a
    tile's odd first block; a turn's one for each 64 queries of its ``block_m``-row block), stores nothing to local
    memory in its loops (with per-element reductions its hdim-128 build spilled about 45 values a block) and fits
    one SM's shared memory. The persistent form takes its tiles by one atomic add, and loads nothing from local
    memory in its loops either (its tiles' state beside the hdim-128 loop's had ptxas reload 3-15 values a block),
    but one loop-invariant value a block in one consumer's causal hdim-64 loop on 128-row blocks (as the one-tile
    kernel on 64-row blocks). A consumer stages each 64 x 64 dQ^T tile in the registers' order, by eight 16-byte
    stores (8-byte ones into the TMA's swizzled tile met two-way bank conflicts)."""
    reductions = dict(result["ptx_reductions"])
    persistent = "persistent" in name
    if persistent:
        assert reductions.pop(TILE_COUNTER, 0) == 1, f"{name}: {result['ptx_reductions']}"
    assert not any(op.startswith(("red.", "atom.")) for op in reductions), f"{name}: {reductions}"
    if "fused dQ" in name or reductions:
        tiles = block_m // 64 if head_dim == 64 else 1
        unmasked_loop = head_dim == 128 and causal and not persistent
        expected = {TMA_REDUCTION: (6 if unmasked_loop else 4) if head_dim == 128 else (4 if persistent else 3) * tiles}
        assert reductions == expected, f"{name}: {reductions}"
        if unmasked_loop:
            assert sorted(loop["FSEL"] for loop in result["loops"]) == [0, 0, 32, 32], f"{name}: {result['loops']}"
        assert all(loop["UTMAREDG"] == tiles and loop["STS.128"] == 8 * tiles for loop in result["loops"]), (
            f"{name}: {result['loops']}")
        assert result["loop_STL"] == 0, f"{name}: spills in its loops ({result['loops']})"
        # persistent: one loop-invariant value a block in the causal 128-row hdim-64 loop, none elsewhere; one tile a
        # program: one value a block at most (the hdim-128 causal walk's hidden first block stays outside the loops:
        # inside the heads' loop it made them reload 11-13)
        reloads = (2 if tiles == 2 and causal else 0) if persistent else 1
        assert all(loop["LDL"] <= reloads for loop in result["loops"]), (
            f"{name}: reloads in its loops ({result['loops']})")
        assert result["shared_bytes"] <= HOPPER_SHARED_BYTES, f"{name}: {result['shared_bytes']} B of shared memory"


# The child that runs the build scripts of a test process, one after another, each in a namespace of its own as if
# run by ``python -c``: its imports (torch, triton: about 4 s on two cores, before any ptxas) are paid once, not once
# a test. It answers each script with one JSON line, {"printed": its stdout, "error": its traceback or None}, on the
# stdout it was started with; what the builds write to file descriptor 1 itself (a tool's output) goes to stderr.
BUILDER = r"""
import contextlib, io, json, os, sys, traceback
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
for line in sys.stdin:
    printed, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(json.loads(line), "<build script>", "exec"), {"__name__": "__main__"})
    except BaseException:
        error = traceback.format_exc()
    replies.write(json.dumps({"printed": printed.getvalue(), "error": error}) + "\n")
    replies.flush()
"""
BUILD_TIMEOUT_S = 600


class _Builder:
    """The BUILDER child, without the interpreter, its stderr kept in a temporary file for a failure's message."""

    current: _Builder | None = None

    def __init__(self):
        env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by close(), with the child)
        self.process = subprocess.Popen([sys.executable, "-c", BUILDER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def run(self, script: str) -> dict | None:
        """The child's reply to ``script``, or None when it died or ran past BUILD_TIMEOUT_S."""
        try:
            self.process.stdin.write(json.dumps(script) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.process.stdout], [], [], BUILD_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def close(self) -> str:
        """Ends the child; returns the end of its stderr."""
        with contextlib.suppress(BrokenPipeError):  # a child that died may leave the pipe unflushed
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.log.seek(0)
        stderr = self.log.read()[-3000:]
        self.log.close()
        return stderr


@pytest.fixture(scope="session", autouse=True)
def _builder_closed():
    yield
    if _Builder.current is not None:
        _Builder.current.close()
        _Builder.current = None


def _compiled(script: str) -> list:
    """The JSON lines ``script`` prints, run in the builder child (started on first use, and again after one died)."""
    if _Builder.current is None or _Builder.current.process.poll() is not None:
        if _Builder.current is not None:
            _Builder.current.close()
        _Builder.current = _Builder()
    reply = _Builder.current.run(script)
    if reply is None:  # the child died or hangs: the next script gets a new one
        builder, _Builder.current = _Builder.current, None
        builder.process.kill()
        pytest.fail(f"the build child died or ran past {BUILD_TIMEOUT_S} s: {builder.close()}")
    assert reply["error"] is None, reply["error"][-3000:]
    return [json.loads(line) for line in reply["printed"].splitlines() if line.startswith("[")]


@pytest.mark.parametrize("group", groups(TABLE_BUILDS),
                         ids=lambda group: "+".join(f"{phase}-{head_dim}-{'causal' if causal else 'full'}"
                                                   for phase, head_dim, causal in group))
def test_table_kernels_keep_wgmma_asynchronous(group):
    results = _compiled(COMPILE_BUILDS.format(benchmarks=str(ROOT / "benchmarks"), builds=list(group)))
    assert len(results) == len(group)
    built = [(build, result) for build, (result,) in zip(group, results, strict=True) if result is not None]
    if not built:
        pytest.skip(f"no Hopper entry for {group}")
    for (phase, head_dim, causal), result in built:
        name = f"{phase} hdim {head_dim} causal {causal}"
        assert result["HGMMA"] > 0, f"{name}: no wgmma at all (HMMA {result['HMMA']})"
        assert result["wgmma_serialized"] is None, f"{name}: ptxas serialized the wgmma: {result['wgmma_serialized']}"
        assert result["unwritten_uniform_reads"] == 0, f"{name}: {UNWRITTEN_READS}"
        assert result["idle_barriers"] == [], f"{name}: barriers initialized and never used {result['idle_barriers']}"
        if phase.startswith("dkdv"):
            check_dq_reductions(name, result, head_dim, causal)
        if phase in ("forward_hopper", "dq_hopper"):
            # O (dQ) stored 16 bytes a thread, through scratch shared memory or the consumer's Q tile: head_dim / 16
            # stores a consumer, two consumers at least
            assert result["STG.E.128"] >= 2 * head_dim // 16, f"{name}: {result['STG.E.128']} 16-byte stores"
        if phase == "forward_hopper" and causal:
            # the masks' one comparison and one select a score (forward_hopper.visible_keys): a block's exponentials
            # are its scores and two rows' factors
            for loop in result["loops"]:
                assert loop["FSEL"] <= loop["MUFU.EX2"] + 2 and loop["ISETP"] <= loop["MUFU.EX2"] + 3, (
                    f"{name}: more than one comparison and select a score ({loop})")


# One query: Triton makes seqlen_q = 1 a constant, and ptxas died (SIGSEGV) on the peeled causal hdim-64 dK/dV kernel
# built that way, so the launcher takes its one-loop form there (launch.backward.dkdv_compilable)
ONE_QUERY_BUILDS = builds([(phase, head_dim) for phase in ("dkdv", "dq") for head_dim in HEAD_DIMS],
                          [("dkdv", 64), ("dq", 128)])
COMPILE_ONE_QUERY = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
for phase, head_dim in {ONE_QUERY_BUILDS!r}:
    result = sass_report.table_report(phase, head_dim, True, seqlen=1024, seqlen_q=1)
    print(json.dumps([f"{{phase}} hdim {{head_dim}}", result]), flush=True)
"""


def test_table_backward_kernels_compile_for_one_query():
    results = dict(_compiled(COMPILE_ONE_QUERY))
    assert len(results) == len(ONE_QUERY_BUILDS)
    for name, result in results.items():
        assert result["HGMMA"] + result["HMMA"] > 0, f"{name}: no matrix instruction"


@pytest.mark.parametrize("names", groups(list(SWEPT_BUILDS)), ids="+".join)
def test_swept_hopper_tiles_keep_wgmma_asynchronous(names):
    script = COMPILE_SWEPT.format(benchmarks=str(ROOT / "benchmarks"), builds=[SWEPT_BUILDS[n] for n in names])
    results = _compiled(script)
    assert len(results) == len(names)
    for name, (result,) in zip(names, results, strict=True):
        assert result["HGMMA"] > 0, f"{name}: no wgmma at all"
        assert result["wgmma_serialized"] is None, f"{name}: ptxas serialized the wgmma: {result['wgmma_serialized']}"
        assert result["unwritten_uniform_reads"] == 0, f"{name}: {UNWRITTEN_READS}"
        assert result["idle_barriers"] == [], f"{name}: barriers initialized and never used {result['idle_barriers']}"
        if name in SWEPT_DKDV_TILES or name in SWEPT_FUSED_DQ_TILES:
            _, head_dim, causal, fields, _ = SWEPT_BUILDS[name]
            check_dq_reductions(name, result, head_dim, causal, fields["block_m"])
        if name in SWEPT_FUSED_DQ_TILES:
            # dV and dK staged in a consumer's slice of V (backward_fused_dq.store_gradients): head_dim / 16 16-byte
            # stores a tensor a consumer
            head_dim = SWEPT_BUILDS[name][1]
            assert result["STG.E.128"] >= 4 * head_dim // 16, f"{name}: {result['STG.E.128']} 16-byte stores"
        if name in SWEPT_DQ_TILES:  # 160 registers a consumer thread hold the three-consumer dQ without spills
            assert result["STL"] == 0 and result["LDL"] == 0, f"{name}: spills"
        if name in TWO_PROGRAM_FORWARDS:
            assert result["registers"] * result["warps"] * 32 * 2 <= 65536, f"{name}: {result['registers']} registers"
            assert 2 * (result["shared_bytes"] + 1024) <= 228 * 1024, f"{name}: {result['shared_bytes']} B shared"
            assert result["STL"] == 0 and result["LDL"] == 0, f"{name}: spills"


# The short-sequence forward tiles, dense and packed: the packed build reads cu_seqlens and may hold more registers,
# and at 512-1k tokens a program fewer on an SM is what the packed call loses (the causal hdim-128 tile at 512: 186
# registers against 153, two programs an SM against three, 12% slower; docs/perf-notes.md)
SHORT_FORWARD_BUILDS = builds([(seqlen, head_dim, causal) for seqlen in (512, 1024) for head_dim in (64, 128)
                               for causal in (False, True)], [(512, 128, True), (1024, 64, False)])
COMPILE_SHORT_FORWARD = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
for seqlen, head_dim, causal in {SHORT_FORWARD_BUILDS!r}:
    for varlen in (False, True):
        result = sass_report.table_report("forward", head_dim, causal, seqlen, varlen=varlen)
        print(json.dumps([seqlen, head_dim, causal, varlen, result]), flush=True)
"""
SM90_REGISTERS, SM90_SHARED_BYTES, BLOCK_RESERVED_SHARED_BYTES = 65536, 228 * 1024, 1024


def programs_per_sm(result: dict) -> int:
    """Programs of one kernel an sm90 SM holds, by its registers (allocated 8 a thread at a time) and shared memory."""
    threads = 32 * result["warps"]
    by_registers = SM90_REGISTERS // (-(-result["registers"] // 8) * 8 * threads)
    by_shared = SM90_SHARED_BYTES // (result["shared_bytes"] + BLOCK_RESERVED_SHARED_BYTES)
    return min(by_registers, by_shared)


def test_packed_short_forward_tiles_fit_as_many_programs_as_dense_ones():
    results = {}
    for seqlen, head_dim, causal, varlen, result in _compiled(COMPILE_SHORT_FORWARD):
        results[(seqlen, head_dim, causal, varlen)] = result
    assert len(results) == 2 * len(SHORT_FORWARD_BUILDS)
    for (seqlen, head_dim, causal, varlen), result in results.items():
        if varlen:
            dense = results[(seqlen, head_dim, causal, False)]
            name = f"forward {seqlen} hdim {head_dim} causal {causal}"
            assert programs_per_sm(result) >= programs_per_sm(dense), (
                f"{name}: packed build {result['registers']} registers, dense {dense['registers']}")
            assert result["loop_STL"] == 0 and result["loop_LDL"] == 0, f"{name}: the packed build spills in its loop"
        name = f"forward {seqlen} hdim {head_dim} causal {causal} varlen {varlen}"
        assert result["unwritten_uniform_reads"] == 0, f"{name}: {UNWRITTEN_READS}"


DECODE_TILES = builds([(128, 64, 4, 1, False, 8, 2, True), (128, 64, 4, 16, True, 16, 2, False),
                       (128, 64, 4, 16, True, 16, 2, True), (64, 64, 4, 0, False, 8, 2, True),
                       (128, 64, 4, 1, False, 8, 1, False), (128, 64, 4, 1, False, 0, 1, True),
                       (128, 128, 3, 16, True, 0, 1, False), (64, 64, 4, 0, False, 0, 1, False),
                       (128, 64, 4, 1, True, 0, 1, True)],
                      [(128, 64, 4, 16, True, 16, 2, False), (64, 64, 4, 0, False, 8, 2, True),
                       (128, 64, 4, 1, False, 0, 1, True), (128, 128, 3, 16, True, 0, 1, False),
                       (128, 64, 4, 1, False, 8, 1, False)])


@pytest.mark.parametrize("tiles", groups(DECODE_TILES),
                         ids=lambda tiles: "+".join("-".join(map(str, t)) for t in tiles))
def test_hopper_decode_tiles_compile_without_spills(tiles):
    """The Hopper decode kernel's tiles (configs.hopper_decode_tile: head dim, block_n, stages, new keys, paged, query
    rows, consumers, early) compile for sm90 with no local-memory spills and within one program's shared memory, with
    swapped products (8 or 16 query rows; one or two consumers) and padded rows (0), the partitions reading the
    sequence's length or not (``early``): the interpreter cannot run Gluon."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
for head_dim, block_n, stages, new_keys, paged, query_rows, consumers, early in {list(tiles)!r}:
    print(json.dumps([sass_report.hopper_decode_report(head_dim, block_n, stages, new_keys=new_keys, paged=paged,
                                                       query_rows=query_rows, consumers=consumers,
                                                       early_first_block=early)]), flush=True)
"""
    results = _compiled(script)
    assert len(results) == len(tiles)
    for tile, (result,) in zip(tiles, results, strict=True):
        assert result["STL"] == 0 and result["LDL"] == 0, (tile, result)
        assert result["shared_bytes"] <= HOPPER_SHARED_BYTES, (tile, result)
        assert result["unwritten_uniform_reads"] == 0, (tile, UNWRITTEN_READS)
        assert result["idle_barriers"] == [], (tile, result["idle_barriers"])


# (head dim, kernel, group, delta): the two passes, the one pass at each width's largest group (its registers' limit),
# and dO's quantization with its delta (the FP8 backward's: block descales in one pass, per-head ones in two)
QUANTIZER_BUILDS = [(head_dim, phase, 1, False) for head_dim in (128, 256) for phase in ("amax", "quantize")] + [
    (128, "one_pass", 1, False), (128, "one_pass", 2, False), (256, "one_pass", 1, False), (64, "one_pass", 4, False),
    (128, "one_pass", 2, True), (64, "one_pass", 4, True), (128, "quantize", 1, True)]


@pytest.mark.skipif(not ALL_BUILDS, reason="GPU machines (or FLASHATTN_ALL_SM90_COMPILES=1): 11 builds of seconds")
def test_fp8_quantizer_kernels_compile_without_spills():
    """The FP8 quantizer's two passes (configs.QUANTIZE_TILES) at head dims 128 and 256 keep S and the rotated rows
    out of local memory (S held whole in registers spilled up to 11 KB a thread at head dim 256) and fit Hopper's
    shared memory (a pipelined row loop asked for 290-525 KB and failed to launch); so does the one pass
    (configs.QUANTIZE_ONE_PASS_TILES), whose rotated block stays in registers, at the largest groups it takes."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
for head_dim, phase, group, delta in {QUANTIZER_BUILDS!r}:
    print(json.dumps([sass_report.quantize_report(head_dim, phase, group, delta)]), flush=True)
"""
    results = _compiled(script)
    assert len(results) == len(QUANTIZER_BUILDS)
    for build, (result,) in zip(QUANTIZER_BUILDS, results, strict=True):
        assert result["STL"] == 0 and result["LDL"] == 0, (build, result)
        assert result["shared_bytes"] <= HOPPER_SHARED_BYTES, (build, result)
        assert result["wgmma_serialized"] is None, (build, result["wgmma_serialized"])


def test_hopper_decode_refuses_a_ring_its_consumers_share():
    """Two swapped consumers on a 5-stage ring would take its stages in turn (a fault on the GPU): the kernel's
    assertion stops the compile."""
    script = f"""
import json, sys, traceback
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
try:
    sass_report.hopper_decode_report(128, 64, 5, query_rows=8, consumers=2)
    print(json.dumps(["compiled"]))
except Exception as error:  # the assertion's message is in the chain of causes
    print(json.dumps(["".join(traceback.format_exception(error))]))
"""
    (message,) = _compiled(script)[0]
    assert "each consumer keeps its own stages" in message


# The Gluon FP8 forward's table entries (kernels/forward_fp8_hopper.py), with block or per-head descales: e4m3 wgmma
# (QGMMA in SASS) kept asynchronous, and no spills in the hdim-64 and -128 loops (hdim 256's 64-key tile keeps a few
# loads from local memory in its loops)
FP8_BUILDS = builds([(head_dim, causal, per_block) for head_dim in HEAD_DIMS for causal in (False, True)
                     for per_block in (True, False)], [(128, False, True), (64, True, False)])
COMPILE_FP8 = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import torch
import sass_report
from flashattn import configs
for head_dim, causal, per_block in {{builds!r}}:
    config = configs.lookup("hopper", "forward_fp8", head_dim, causal, torch.float8_e4m3fn, hopper=True)
    print(json.dumps([sass_report.hopper_fp8_forward_report(head_dim, causal, config, per_block)]), flush=True)
"""


@pytest.mark.parametrize("group", groups(FP8_BUILDS),
                         ids=lambda group: "+".join(f"fp8-{d}-{'causal' if c else 'full'}-{'block' if b else 'head'}"
                                                   for d, c, b in group))
def test_fp8_gluon_forward_keeps_wgmma_asynchronous(group):
    results = _compiled(COMPILE_FP8.format(builds=list(group)))
    assert len(results) == len(group)
    for (head_dim, causal, per_block), (result,) in zip(group, results, strict=True):
        name = f"fp8 hdim {head_dim} causal {causal} per_block {per_block}"
        assert result["QGMMA"] > 0, f"{name}: no e4m3 wgmma (HGMMA {result['HGMMA']})"
        assert result["wgmma_serialized"] is None, f"{name}: ptxas serialized the wgmma: {result['wgmma_serialized']}"
        assert result["unwritten_uniform_reads"] == 0, f"{name}: {UNWRITTEN_READS}"
        assert result["idle_barriers"] == [], f"{name}: barriers initialized and never used {result['idle_barriers']}"
        if head_dim <= 128:
            assert result["loop_STL"] == 0 and result["loop_LDL"] == 0, f"{name}: spills in its loops"


# The Gluon FP8 dK/dV kernel (kernels/backward_fp8_hopper.py) as launch/backward_fp8.py builds it, (head dim, causal,
# left window, S^T and dP^T on float16 copies): the tile products dV and dK on e4m3 wgmma (QGMMA), and with e4m3
# scores no 16-bit wgmma at all (HGMMA); kept asynchronous, within shared memory. Its loops as measured: none spill at
# hdim 64; at hdim 128 the two 64 x 128 float32 gradients and the tile product's accumulator (192 of the 240
# registers) leave a few values in local memory, reloaded every query block (FP8_DKDV_LOOP_SPILLS: the most (stores,
# loads) per build, summed over the two consumers' loops; measured 1 and 3-6 with e4m3 scores, 1-3 and 18-22 with
# float16 ones)
FP8_DKDV_BUILDS = builds([(d, c, w, f) for d in (64, 128) for c in (False, True) for w in (False, True)
                          for f in (False, True)],
                         [(128, True, False, True)])
FP8_DKDV_LOOP_SPILLS = {64: (0, 0), 128: (3, 24)}
# each FP8 backward kernel's builds (head dim, causal, left window, float16 scores), compiled in one process
COMPILE_FP8_BACKWARD = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import sass_report
for head_dim, causal, window_left, scores_16bit in {{builds!r}}:
    report = sass_report.hopper_fp8_{{kernel}}_report(head_dim, causal, window_left, scores_16bit)
    print(json.dumps([report]), flush=True)
"""


def _fp8_backward_ids(kernel: str):
    return lambda group: "+".join(f"fp8-{kernel}-{d}-{'causal' if c else 'full'}{'-window' if w else ''}"
                                 f"{'-fp16-scores' if f else ''}" for d, c, w, f in group)


def _fp8_backward_reports(kernel: str, group: tuple) -> list[tuple[tuple, dict]]:
    """(build, sass_report's report) of each build of ``group``, the FP8 ``kernel`` ("dkdv", "dq" or "dkdv_dq")."""
    results = _compiled(COMPILE_FP8_BACKWARD.format(kernel=kernel, builds=list(group)))
    assert len(results) == len(group)
    return [(build, result) for build, (result,) in zip(group, results, strict=True)]


@pytest.mark.parametrize("group", groups(FP8_DKDV_BUILDS), ids=_fp8_backward_ids("dkdv"))
def test_fp8_gluon_dkdv_takes_e4m3_wgmma(group):
    for (head_dim, causal, window_left, scores_16bit), result in _fp8_backward_reports("dkdv", group):
        name = f"fp8 dK/dV hdim {head_dim} causal {causal} window_left {window_left} scores_16bit {scores_16bit}"
        assert result["QGMMA"] > 0, f"{name}: no e4m3 wgmma"
        # S^T and dP^T: HEAD_DIM / 16 float16 wgmma each, in each of the two consumers' loops (one a consumer)
        _assert_fp8_backward_build(name, result, 2 * 2 * head_dim // 16 if scores_16bit else 0, 2,
                                   FP8_DKDV_LOOP_SPILLS[head_dim])


# The Gluon FP8 dK/dV/dQ kernel (kernels/backward_fp8_fused_hopper.py), the dK/dV kernel's builds: in each of the two
# consumers' loops the dV and dK tile products (2 QGMMA each), dQ's over the 128 keys (K = 32 a QGMMA: 4), S^T and dP^T
# as in the dK/dV kernel; dS stored by 2 stmatrix (STSM) and dQ's half added by 1 TMA reduction (UTMAREDG) a block.
# Head dim 64 only (the launch's), without spills (FP8_DKDV_DQ_LOOP_SPILLS: the most (stores, loads) per build, summed
# over the two loops).
FP8_DKDV_DQ_BUILDS = builds([(64, c, w, f) for c in (False, True) for w in (False, True) for f in (False, True)],
                            [(64, True, True, True)])
FP8_DKDV_DQ_LOOP_SPILLS = {64: (0, 0)}


@pytest.mark.parametrize("group", groups(FP8_DKDV_DQ_BUILDS), ids=_fp8_backward_ids("dkdv_dq"))
def test_fp8_gluon_dkdv_dq_takes_e4m3_wgmma(group):
    for (head_dim, causal, window_left, scores_16bit), result in _fp8_backward_reports("dkdv_dq", group):
        name = f"fp8 dK/dV/dQ hdim {head_dim} causal {causal} window_left {window_left} scores_16bit {scores_16bit}"
        scores = 2 * head_dim // (16 if scores_16bit else 32)
        qgmma = 2 * (2 + 2 + 128 // 32 + (0 if scores_16bit else scores))
        assert result["QGMMA"] == qgmma, f"{name}: {result['QGMMA']} e4m3 wgmma, not {qgmma}"
        _assert_fp8_backward_build(name, result, 2 * scores if scores_16bit else 0, 2,
                                   FP8_DKDV_DQ_LOOP_SPILLS[head_dim])
        for loop in result["loops"]:
            assert loop["STSM"] == 2 and loop["UTMAREDG"] == 1, f"{name}: not dS's 2 stmatrix and 1 reduction: {loop}"


def _assert_fp8_backward_build(name: str, result: dict, hgmma: int, loops: int, spills: tuple[int, int]):
    """What both FP8 backward kernels' builds must be: ``hgmma`` float16 wgmma, none serialized, no unwritten uniform
    register read, within shared memory, ``loops`` hot loops holding at most ``spills`` (stores, loads)."""
    assert result["HGMMA"] == hgmma, f"{name}: {result['HGMMA']} 16-bit wgmma, not {hgmma}"
    assert result["wgmma_serialized"] is None, f"{name}: ptxas serialized the wgmma: {result['wgmma_serialized']}"
    assert result["unwritten_uniform_reads"] == 0, f"{name}: {UNWRITTEN_READS}"
    assert result["idle_barriers"] == [], f"{name}: barriers initialized and never used {result['idle_barriers']}"
    assert result["shared_bytes"] <= HOPPER_SHARED_BYTES, f"{name}: {result['shared_bytes']} B of shared memory"
    assert result["hot_loops"] == loops, f"{name}: {loops} hot loops, not {result['loops']}"
    stores, loads = spills
    assert result["loop_STL"] <= stores and result["loop_LDL"] <= loads, (
        f"{name}: {result['loop_STL']} spill stores, {result['loop_LDL']} loads in its loops ({result['loops']})")


# The Gluon FP8 dQ kernel (kernels/backward_fp8_dq_hopper.py) as launch/backward_fp8.py builds it, (head dim, causal,
# left window, S and dP on float16 copies): dQ's tile product on e4m3 wgmma (four QGMMA over a 128-key block in
# each loop), S and dP on float16 wgmma or e4m3 ones; kept asynchronous, within shared memory (hdim 128 with
# float16 scores: 224 KB of its 227). Each consumer has two loops (the blocks its rows see whole, then the masked
# ones), three with a left window (its masked blocks first). Their spills as measured: none at hdim 64; at hdim 128
# a loop keeps at most 1 store and 1 load (FP8_DQ_FULL_LOOP_SPILLS for the unmasked loops, FP8_DQ_LOOP_SPILLS the
# most (stores, loads) per build, summed over every loop: measured 1 and 1 in three loops of the left-window builds
# with float16 scores, none in the others)
FP8_DQ_BUILDS = builds([(d, c, w, f) for d in (64, 128) for c in (False, True) for w in (False, True)
                        for f in (False, True)],
                       [(128, True, True, True)])
FP8_DQ_LOOP_SPILLS = {64: (0, 0), 128: (3, 3)}
FP8_DQ_FULL_LOOP_SPILLS = {64: (0, 0), 128: (1, 1)}


@pytest.mark.parametrize("group", groups(FP8_DQ_BUILDS), ids=_fp8_backward_ids("dq"))
def test_fp8_gluon_dq_takes_e4m3_wgmma(group):
    for (head_dim, causal, window_left, scores_16bit), result in _fp8_backward_reports("dq", group):
        name = f"fp8 dQ hdim {head_dim} causal {causal} window_left {window_left} scores_16bit {scores_16bit}"
        # in each loop: dS K over 128 keys (K = 32 a QGMMA), S and dP over the head dim (K = 16 a float16 HGMMA, 32
        # an e4m3 QGMMA)
        loops = 2 * (3 if window_left else 2)
        scores = 2 * head_dim // (16 if scores_16bit else 32)
        qgmma, hgmma = loops * (128 // 32 + (0 if scores_16bit else scores)), loops * scores if scores_16bit else 0
        assert result["QGMMA"] == qgmma, f"{name}: {result['QGMMA']} e4m3 wgmma, not {qgmma}"
        _assert_fp8_backward_build(name, result, hgmma, loops, FP8_DQ_LOOP_SPILLS[head_dim])
        # the unmasked loops: each consumer's shortest
        stores, loads = FP8_DQ_FULL_LOOP_SPILLS[head_dim]
        for loop in sorted(result["loops"], key=lambda loop: loop["instructions"])[:2]:
            assert loop["STL"] <= stores and loop["LDL"] <= loads, f"{name}: spills in an unmasked loop: {loop}"
