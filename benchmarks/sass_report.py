"""Compile one flashattn kernel for sm90 on a machine without a GPU and report what ptxas made of it.

Triton runs its whole MLIR pipeline and ptxas (both ship in the triton wheel) for a ``GPUTarget``, so
registers, stack (spills), shared memory, warps and the instruction mix (HGMMA vs HMMA, FP ops) can be
read on the CPU machine before any device time is spent. Unspecified constexprs default to False,
pointers to *bf16 (Lse/Delta/AlibiSlopes *fp32; CuSeqlens*, BlockMap, BlockTable and the kvcache's
CacheSeqlens/CacheBatchIdx/CacheLeftpad *i32), other arguments to i32.

Pointers and ``stride_*`` arguments are compiled as multiples of 16, as Triton's launcher specializes
them for 16-byte aligned tensors whose strides are multiples of 16 elements (every benchmark shape):
that lets loads use 16-byte vectors and cp.async. ``aligned=False`` compiles the unspecialized kernel.
``loop_STL``/``loop_LDL`` count the spill instructions inside the innermost loops that hold the tensor
core instructions (HGMMA/HMMA): the ones paid on every tile, where the totals include one-off spills
around the loops.

    PYTHONPATH=src python benchmarks/sass_report.py flashattn.kernels.forward:attention_forward_kernel 8 3 \\
        HEAD_DIM=128 BLOCK_D=128 BLOCK_M=128 BLOCK_N=128 DOT_PRECISION='"tf32"' USE_TMA=True

``dtype=``, ``aligned=False``, ``maxnreg=N`` (ptxas's register cap) and ``divisible='"a,b"'`` (int arguments
the launcher would see as multiples of 16) are options, not constexprs; a run-time argument given a value
(``group_size=1``) is compiled as the launcher specializes a 1.
On the GPU machine, ``--cache DIR KERNEL`` reports the kernels the launcher compiled into a Triton cache;
``--table forward,dkdv,dq SEQLEN`` reports the tile table's kernels for a benchmark-grid shape (the Hopper kernels'
entries: ``forward_hopper``, ``dkdv_hopper``, ``dq_hopper``).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import importlib
import inspect
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sass_uniform_reads
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.cache import get_cache_manager

BIN = triton.__path__[0] + "/backends/nvidia/bin/"
FLOAT_ARGS = {"softmax_scale", "qk_scale", "softcap_log2", "dropout_p"}
FP32_POINTERS = {"Lse", "Delta", "AlibiSlopes", "DMask"}
INT32_POINTERS = {"BlockMap", "BlockTable", "CacheSeqlens", "CacheBatchIdx", "CacheLeftpad"}
# QGMMA: the FP8 (e4m3) wgmma's SASS name
# REDG: per-element global reductions; UTMAREDG: TMA tile reductions (the fused dK/dV/dQ kernel's dQ)
# STSM: stmatrix (the FP8 dK/dV/dQ kernel's dS store)
# STG.E.128: 16-byte global stores (the Hopper forward's O, staged in scratch shared memory or the consumer's Q tile)
COUNTED_OPS = ("HGMMA", "QGMMA", "HMMA", "FFMA", "FMUL", "FADD", "MUFU.EX2", "STL", "LDL", "REDG", "UTMAREDG",
               "STG.E.128")
_COUNTED = re.compile(r"\b(" + "|".join(re.escape(op) for op in COUNTED_OPS) + r")\b")
LOOP_OPS = ("HGMMA", "QGMMA", "HMMA", "WARPGROUP.DEPBAR", "MUFU.EX2", "STL", "LDL", "BAR", "LDGSTS", "LDG", "ISETP",
            "FSEL", "REDG", "UTMAREDG", "STSM", "STS.128")


def signature(kernel, constexprs: dict, dtype: str) -> dict:
    types = {}
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if name in constexprs:
            types[name] = "constexpr"  # a run-time argument given a value: the launcher's "== 1" specialization
        elif "constexpr" in str(param.annotation):
            constexprs.setdefault(name, param.default if param.default is not inspect.Parameter.empty else False)
            types[name] = "constexpr"
        elif name in FLOAT_ARGS:
            types[name] = "fp32"
        elif name.startswith("CuSeqlens") or name in INT32_POINTERS:
            types[name] = "*i32"
        elif name[0].isupper():
            types[name] = "*fp32" if name in FP32_POINTERS else f"*{dtype}"
        else:
            types[name] = "i32"
    return types


def alignment_hints(types: dict, divisible: tuple[str, ...] = ()) -> dict:
    """``tt.divisibility`` 16 on every pointer and stride, as the launcher gives aligned tensors, and on the
    integer arguments named in ``divisible`` (the launcher marks any int that is a multiple of 16)."""
    return {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(types.items())
            if kind.startswith("*") or name.startswith("stride_") or name in divisible}


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of each instruction in cuobjdump's SASS listing."""
    found = []
    for line in sass.splitlines():
        match = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if match:
            found.append((int(match.group(1), 16), match.group(2)))
    return found


def loop_spills(loops: list[dict]) -> dict:
    """STL/LDL inside the innermost loops that hold HGMMA or HMMA (``hot_loops``)."""
    return {"hot_loops": len(loops), "loop_STL": sum(loop["STL"] for loop in loops),
            "loop_LDL": sum(loop["LDL"] for loop in loops)}


def hot_loops(listed: list[tuple[int, str]]) -> list[dict]:
    """Per innermost tensor-core loop of a SASS listing (``instructions``): its instruction count and the
    instructions that cost a tile's time (matrix, exponentials, spills, barriers, async copies, compares and selects
    of masks)."""
    loops = []
    for address, text in listed:
        jump = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if jump and int(jump.group(1), 16) <= address:
            loops.append((int(jump.group(1), 16), address))
    innermost = [loop for loop in loops
                 if not any(other != loop and loop[0] <= other[0] and other[1] <= loop[1] for other in loops)]
    found = []
    for lo, hi in innermost:
        body = [text for address, text in listed if lo <= address <= hi]
        counts = {op: sum(1 for text in body if re.search(r"\b" + re.escape(op) + r"\b", text))
                  for op in LOOP_OPS}
        if counts["HGMMA"] + counts["QGMMA"] + counts["HMMA"]:
            found.append({"range": f"{lo:#x}-{hi:#x}", "instructions": len(body), **counts})
    return found


def report(compiled, ptxas_log: str | None = None) -> dict:
    """``ptxas_log``: the log of the compile that built ``compiled`` (``compile_sm90``); without it the PTX is
    assembled again for it. The kernel's SASS listings are kept beside it in Triton's cache (:func:`kept`)."""
    cache = get_cache_manager(compiled.hash)
    cubin = compiled.asm["cubin"]
    listings = tuple(kept(cache, f"sass_report{what}.txt", lambda what=what: disassemble(cubin, what))
                     for what in ("-sass", "-res-usage"))
    return {**report_cubin(cubin, compiled.metadata.shared, compiled.metadata.num_warps, listings),
            "wgmma_serialized": serialization_reason(ptxas_log or kept(
                cache, PTXAS_LOG, lambda: assemble(compiled.asm["ptx"]))),
            "ptx_reductions": ptx_reductions(compiled.asm["ptx"]),
            "idle_barriers": idle_barriers(compiled.asm["ttgir"])}


# ptxas's log of a kernel's compile, kept beside the kernel in Triton's cache: a compile that Triton's cache answers
# runs no ptxas, and assembling its PTX again for the log is a third of a cached build's report
PTXAS_LOG = "sass_report_ptxas.log"


def kept(cache, filename: str, make) -> str:
    """The text file ``filename`` of a kernel's entry ``cache`` in Triton's cache (``get_cache_manager``), or
    ``make()`` written there first: the tools' output on the kernel's own files (its PTX, its cubin), the same on every
    run, for the builds that a machine reports again (tests/test_sm90_compile.py)."""
    path = cache.get_file(filename)
    if path is None:
        path = cache.put(make(), filename, binary=False)
    return Path(path).read_text()


def compile_sm90(source, options: dict):
    """``triton.compile`` for sm90, and ptxas's log of it (Triton prints the log it keeps with
    ``knobs.nvidia.dump_ptxas_log``; kept in its cache entry as PTXAS_LOG), or None where the kernel came from
    Triton's cache before a log was kept there."""
    printed = io.StringIO()
    dump = triton.knobs.nvidia.dump_ptxas_log
    triton.knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(printed):
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    finally:
        triton.knobs.nvidia.dump_ptxas_log = dump
    cache = get_cache_manager(compiled.hash)
    log = printed.getvalue()
    if log:
        cache.put(log, PTXAS_LOG, binary=False)
        return compiled, log
    path = cache.get_file(PTXAS_LOG)
    return compiled, Path(path).read_text() if path else None


def ptx_reductions(ptx: str) -> dict:
    """The PTX's TMA reductions (``cp.reduce.async.bulk.tensor``) and global reductions and atomics (``red.global``,
    ``atom.global``, with their type suffixes), by instruction."""
    found: dict = {}
    for name in re.findall(r"\b((?:cp\.reduce\.async\.bulk\.tensor|red|atom)\.[\w:.]+)", ptx):
        if name.startswith("cp.") or ".global" in name:
            found[name] = found.get(name, 0) + 1
    return found


def idle_barriers(ttgir: str) -> list[str]:
    """The barriers (int64 shared-memory allocations) that a build initializes and then never waits on, arrives at,
    hands to a copy or passes to a partition, by their TTGIR names. Such a barrier is dead to the compiler, which gives
    its memory to other shared memory (scratch, staging), while the memory still holds an initialized mbarrier: PTX
    leaves any other access to it undefined, and an unused barrier of the Hopper forward once cost 8 bytes of O in
    some tiles (``forward_hopper.zeroing_barrier``)."""
    lines = ttgir.splitlines()
    idle = []
    for name in re.findall(r"^\s*(%[\w.]+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<[\dx]+xi64,", ttgir, re.M):
        views = {name}  # the allocation and the views of it (an element of a barrier array)
        used = False
        for line in lines:
            mentioned = {view for view in views if re.search(re.escape(view) + r"\b", line)}
            if not mentioned or re.match(r"\s*" + re.escape(name) + r" = ttg\.local_alloc", line):
                continue
            view = re.match(r"\s*(%[\w.]+) = ttg\.memdesc_(?:index|subslice|reinterpret)\b", line)
            if view:
                views.add(view.group(1))
            elif "ttng.init_barrier" not in line:
                used = True
                break
        if not used:
            idle.append(name)
    return idle


def assemble(ptx: str) -> str:
    """ptxas's log (``-v``) of assembling ``ptx`` for sm90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source, tempfile.NamedTemporaryFile(suffix=".cubin") as out:
        source.write(ptx)
        source.flush()
        log = subprocess.run([BIN + "ptxas", "-v", "--gpu-name=sm_90a", source.name, "-o", out.name],
                             capture_output=True, text=True)
    return log.stderr + log.stdout


def serialization_reason(ptxas_log: str) -> str | None:
    """The reason a ptxas log gives for serializing the wgmma instructions (info C7515), or None. When ptxas cannot
    keep the asynchronous wgmma pipeline, it waits for each wgmma to finish before the next one issues, in the whole
    function: the hdim-128 causal dK/dV kernel ran 45% slower per tile for it (docs/perf-notes.md)."""
    found = re.search(r"wgmma.mma_async instructions are serialized due to (.*?) in the function", ptxas_log)
    return found.group(1) if found else None


def disassemble(cubin_bytes: bytes, what: str = "-sass") -> str:
    """cuobjdump's listing of a cubin: its SASS ("-sass") or its resource usage ("-res-usage")."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(cubin_bytes)
        cubin.flush()
        return subprocess.run([BIN + "cuobjdump", what, cubin.name], capture_output=True, text=True).stdout


def report_cubin(cubin_bytes: bytes, shared_bytes: int | None = None, warps: int | None = None,
                 listings: tuple[str, str] | None = None) -> dict:
    """``listings``: the cubin's SASS and resource usage (:func:`disassemble`), where the caller has them."""
    sass, usage = listings or (disassemble(cubin_bytes), disassemble(cubin_bytes, "-res-usage"))
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    listed = instructions(sass)
    loops = hot_loops(listed)
    counted = collections.Counter(_COUNTED.findall(sass))  # one pass: no two of the names match at one place
    return {
        "registers": int(registers.group(1)) if registers else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "shared_bytes": shared_bytes,
        "warps": warps,
        "instructions": len(listed),
        **{op: counted[op] for op in COUNTED_OPS},
        **loop_spills(loops),
        "loops": loops,
        # ptxas reading a uniform register (a wgmma descriptor) that a path leaves unwritten: wrong results, with no
        # other sign (benchmarks/sass_uniform_reads.py)
        "unwritten_uniform_reads": len(sass_uniform_reads.unwritten_reads(sass)),
    }


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    if argv[0] == "--cache":
        report_cache(Path(argv[1]), argv[2])
        return
    if argv[0] == "--table":
        for phase in argv[1].split(","):
            for head_dim in (64, 128, 256):
                for causal in (False, True):
                    result = table_report(phase, head_dim, causal, int(argv[2]))
                    print(f"{phase} hdim {head_dim} {'causal' if causal else 'full'}: {result}", flush=True)
        return
    module, name = argv[0].split(":")
    kernel = getattr(importlib.import_module(module), name)
    num_warps, num_stages = int(argv[1]), int(argv[2])
    constexprs = {key: ast.literal_eval(value) for key, value in (arg.split("=", 1) for arg in argv[3:])}
    dtype = constexprs.pop("dtype", "bf16")
    aligned = constexprs.pop("aligned", True)
    maxnreg = constexprs.pop("maxnreg", None)
    divisible = tuple(constexprs.pop("divisible", "").split(","))
    start = time.time()
    print(f"{' '.join(argv[1:])}: "
          f"{compile_report(kernel, num_warps, num_stages, constexprs, dtype, aligned, maxnreg, divisible)} "
          f"({time.time() - start:.1f} s)")


def report_cache(cache_dir: Path, kernel_name: str) -> None:
    """Report every ``kernel_name`` in a Triton cache directory: what the launcher compiled on the GPU
    machine, with its own specialization (run each case with its own TRITON_CACHE_DIR to tell them apart)."""
    cubins = sorted(cache_dir.rglob(f"{kernel_name}.cubin"))
    if not cubins:
        raise SystemExit(f"no {kernel_name}.cubin under {cache_dir}")
    for path in cubins:
        metadata = json.loads(path.with_suffix(".json").read_text())
        print(f"{path}: {report_cubin(path.read_bytes(), metadata.get('shared'), metadata.get('num_warps'))}")


# The launcher's specialization on the benchmark grid's shapes (dense, no GQA, lengths and heads multiples of 16,
# causal as window_right = 0): the integer arguments it sees as multiples of 16, and group_size == 1.
GRID_DIVISIBLE = ("seqlen_q", "seqlen_k", "nheads", "nheads_k", "rng_seed", "rng_offset", "diagonal_shift",
                  "dropout_seqlen_q", "dropout_seqlen_k")
# the Hopper kernels' table entries: --table's and table_report's phase -> the table's phase
HOPPER_PHASES = {"forward_hopper": "forward", "dkdv_hopper": "dkdv", "dq_hopper": "dq"}


def table_report(phase: str, head_dim: int, causal: bool, seqlen: int, seqlen_q: int = 0,
                 varlen: bool = False) -> dict | None:
    """:func:`compile_report` of the Hopper tile table's ``phase`` kernel ("forward", "dkdv" or "dq") as
    the launcher compiles it for a bf16 benchmark-grid shape; "forward_hopper", "dkdv_hopper" and "dq_hopper": the
    Hopper kernels' entries (None where the table has none). ``seqlen_q`` = 1: the Triton kernel as the launcher
    specializes it for one query (an integer argument equal to 1 becomes a constant). ``varlen``: the Triton
    kernel's packed build (IS_VARLEN)."""
    import torch

    from flashattn import configs
    from flashattn.kernels import backward, forward
    from flashattn.launch.backward import dkdv_compilable

    if phase in HOPPER_PHASES:
        config = configs.lookup("hopper", HOPPER_PHASES[phase], head_dim, causal, torch.bfloat16, seqlen=seqlen,
                                hopper=True)
        if not config.hopper:
            return None
        report_of = {"forward_hopper": hopper_forward_report, "dkdv_hopper": hopper_dkdv_report,
                     "dq_hopper": hopper_dq_report}[phase]
        return report_of(head_dim, causal, config)
    config = configs.lookup("hopper", phase, head_dim, causal, torch.bfloat16, seqlen=seqlen, packed=varlen)
    kernel = {"forward": forward.attention_forward_kernel, "dkdv": backward.dkdv_kernel,
              "dq": backward.dq_kernel}[phase]
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                      DOT_PRECISION="tf32", WINDOW_RIGHT=causal, group_size=1, USE_TMA=config.tma, IS_VARLEN=varlen)
    if phase == "forward":
        constexprs.update(DEFER_SCALE=True)
    if phase == "dkdv":
        config = dkdv_compilable(config, seqlen_q)
        constexprs.update(MASK_EVERY_BLOCK=config.mask_every_block, PEEL_DIAGONAL=config.peel_diagonal,
                          KEY_ROWS=config.key_rows)
    if seqlen_q == 1:
        constexprs["seqlen_q"] = constexprs["dropout_seqlen_q"] = 1
    divisible = GRID_DIVISIBLE + (("window_right",) if causal else ())
    descriptors = {}
    if phase == "forward" and config.tma:  # Q, K and V through host-side descriptors (launch.forward)
        # dense: sequence descriptors (batch, seqlen, heads * head_dim); packed: over the tokens
        box = "{rows}, " + str(head_dim) if varlen else "1, {rows}, " + str(head_dim)
        descriptors = {name: f"tensordesc<bf16[{box.format(rows=rows)}]>" for name, rows in
                       (("QDesc", config.block_m), ("KDesc", config.block_n), ("VDesc", config.block_n))}
        constexprs["SEQUENCES"] = not varlen
    return compile_report(kernel, config.num_warps, config.num_stages, constexprs, maxnreg=config.max_registers,
                          divisible=divisible, descriptors=descriptors)


def hopper_forward_report(head_dim: int, causal: bool, config, varlen: bool = False) -> dict:
    """:func:`report` of the Hopper forward (``kernels/forward_hopper.py``) with ``config``'s tile, as
    ``launch.forward._hopper_forward`` launches it for bf16 inputs."""
    from flashattn import configs
    from flashattn.kernels.forward_hopper import attention_forward_hopper_kernel
    from flashattn.launch.forward import hopper_forward_constexprs, programs_per_sm

    seqlens = "*i32" if varlen else "*bf16"  # dense calls pass q there, never read
    dense = not varlen  # dense calls read through sequence descriptors
    signature = dict(q_desc=_bf16_descriptor(64, head_dim, dense),
                     k_desc=_bf16_descriptor(config.block_n, head_dim, dense),
                     v_desc=_bf16_descriptor(config.block_n, head_dim, dense), Out="*bf16", Lse="*fp32",
                     CuSeqlensQ=seqlens, CuSeqlensK=seqlens, TileCounter="*i32", stride_om="i32", stride_oh="i32",
                     stride_lb="i32", stride_lh="i32", seqlen_q="i32", seqlen_k="i32", nheads="i32",
                     group_size="i32", row_tiles="i32", batch_heads="i32", heads_per_section="i32",
                     qk_scale_log2="fp32")
    constexprs = hopper_forward_constexprs(config, head_dim, causal, varlen)
    if not constexprs["DYNAMIC_TILES"]:
        del signature["TileCounter"]
        constexprs["TileCounter"] = None  # the launcher passes None
    options = {"maxnreg": configs.HOPPER_TWO_PROGRAMS_REGISTERS} if programs_per_sm(config) == 2 else {}
    return _gluon_report(attention_forward_hopper_kernel, signature, constexprs, options)


def hopper_fp8_forward_report(head_dim: int, causal: bool, config, per_block: bool = True) -> dict:
    """:func:`report` of the Gluon FP8 forward (``kernels/forward_fp8_hopper.py``) with ``config``'s tile, as
    ``launch.forward_fp8._hopper_forward_fp8`` launches it for e4m3 inputs (``per_block``: block descales)."""
    import torch

    from flashattn.kernels.forward_fp8_hopper import attention_forward_fp8_hopper_kernel
    from flashattn.launch.common import tile_layout
    from flashattn.launch.forward_fp8 import hopper_fp8_constexprs

    def descriptor(rows: int, columns: int) -> str:
        return f"tensordesc<fp8e4nv[{rows}, {columns}],{tile_layout(rows, columns, torch.float8_e4m3fn)!r}>"

    signature = dict(q_desc=descriptor(64, head_dim), k_desc=descriptor(config.block_n, head_dim),
                     vt_desc=descriptor(head_dim, config.block_n), Out="*bf16", Lse="*fp32", QDescale="*fp32",
                     KDescale="*fp32", VDescale="*fp32", TileCounter="*i32",
                     **{f"stride_{t}ds_{d}": "i32" for t in "qkv" for d in ("b", "h", "blk")},
                     stride_om="i32", stride_oh="i32", stride_lb="i32", stride_lh="i32", seqlen_q="i32",
                     seqlen_k="i32", nheads="i32", group_size="i32", row_tiles="i32", batch_heads="i32",
                     heads_per_section="i32", qk_scale_log2="fp32")
    constexprs = hopper_fp8_constexprs(config, head_dim, causal, per_block)
    if not constexprs["DYNAMIC_TILES"]:
        del signature["TileCounter"]
        constexprs["TileCounter"] = None  # the launcher passes None
    return _gluon_report(attention_forward_fp8_hopper_kernel, signature, constexprs)


def hopper_fp8_dkdv_report(head_dim: int, causal: bool, window_left: bool = False, scores_16bit: bool = False) -> dict:
    """:func:`report` of the Gluon FP8 dK/dV kernel (``kernels/backward_fp8_hopper.py``) as
    ``launch.backward_fp8`` launches it (``causal``: window_right = 0; ``window_left``: a left window;
    ``scores_16bit``: S^T and dP^T on float16 copies, ``launch.backward_fp8.SCORES_16BIT``)."""
    import torch

    from flashattn.kernels.backward_fp8_hopper import dkdv_fp8_hopper_kernel
    from flashattn.launch.backward_fp8 import hopper_fp8_dkdv_constexprs
    from flashattn.launch.common import tile_layout

    def descriptor(rows: int, columns: int, wide: bool = False) -> str:
        dtype, name = (torch.float16, "fp16") if wide else (torch.float8_e4m3fn, "fp8e4nv")
        return f"tensordesc<{name}[{rows}, {columns}],{tile_layout(rows, columns, dtype)!r}>"

    wide = scores_16bit
    signature = dict(q_desc=descriptor(64, head_dim, wide), do_desc=descriptor(64, head_dim, wide),
                     qt_desc=descriptor(head_dim, 64), dot_desc=descriptor(head_dim, 64),
                     k_desc=descriptor(128, head_dim, wide), v_desc=descriptor(128, head_dim, wide), Lse="*fp32",
                     Delta="*fp32",
                     DK="*fp32", DV="*bf16", QDescale="*fp32", KDescale="*fp32", VDescale="*fp32", DODescale="*fp32",
                     **{name: "i32" for name in ("stride_gb", "stride_gm", "stride_gh", "stride_ds_b", "stride_ds_h",
                                                 "stride_ds_blk", "seqlen_q", "seqlen_k", "nheads", "nheads_k",
                                                 "key_blocks", "heads_per_section", "window_left",
                                                 "window_right")},
                     softmax_scale="fp32", qk_scale_log2="fp32")
    constexprs = {**hopper_fp8_dkdv_constexprs(head_dim, window_left, causal), **_fp8_sections(causal, window_left)}
    return _gluon_report(dkdv_fp8_hopper_kernel, signature, constexprs)


def hopper_fp8_dq_report(head_dim: int, causal: bool, window_left: bool = False, scores_16bit: bool = False) -> dict:
    """:func:`hopper_fp8_dkdv_report` of the Gluon FP8 dQ kernel (``kernels/backward_fp8_dq_hopper.py``)."""
    from flashattn.kernels.backward_fp8_dq_hopper import dq_fp8_hopper_kernel
    from flashattn.launch.backward_fp8 import hopper_fp8_dkdv_constexprs

    wide = scores_16bit
    signature = dict(q_desc=_fp8_descriptor(64, head_dim, wide), do_desc=_fp8_descriptor(64, head_dim, wide),
                     k_desc=_fp8_descriptor(128, head_dim, wide), v_desc=_fp8_descriptor(128, head_dim, wide),
                     kt_desc=_fp8_descriptor(head_dim, 128), Lse="*fp32", Delta="*fp32", DQ="*fp32",
                     QDescale="*fp32", KDescale="*fp32", VDescale="*fp32", DODescale="*fp32",
                     **{name: "i32" for name in ("stride_gb", "stride_gm", "stride_gh", "stride_ds_b", "stride_ds_h",
                                                 "stride_ds_blk", "seqlen_q", "seqlen_k", "nheads", "nheads_k",
                                                 "row_tiles", "heads_per_section", "window_left",
                                                 "window_right")},
                     softmax_scale="fp32", qk_scale_log2="fp32")
    constexprs = {**hopper_fp8_dkdv_constexprs(head_dim, window_left, causal, dq=True),
                  **_fp8_sections(causal, window_left)}
    return _gluon_report(dq_fp8_hopper_kernel, signature, constexprs)


def hopper_fp8_dkdv_dq_report(head_dim: int, causal: bool, window_left: bool = False,
                              scores_16bit: bool = False) -> dict:
    """:func:`hopper_fp8_dkdv_report` of the Gluon FP8 dK/dV/dQ kernel (``kernels/backward_fp8_fused_hopper.py``):
    the dK/dV kernel's arguments, K^T and the float32 dQ accumulator in (64, head_dim / 2) tiles."""
    import torch

    from flashattn.kernels.backward_fp8_fused_hopper import dkdv_dq_fp8_hopper_kernel
    from flashattn.launch.backward_fp8 import hopper_fp8_dkdv_constexprs
    from flashattn.launch.common import tile_layout

    wide = scores_16bit
    half = head_dim // 2
    signature = dict(q_desc=_fp8_descriptor(64, head_dim, wide), do_desc=_fp8_descriptor(64, head_dim, wide),
                     qt_desc=_fp8_descriptor(head_dim, 64), dot_desc=_fp8_descriptor(head_dim, 64),
                     k_desc=_fp8_descriptor(128, head_dim, wide), v_desc=_fp8_descriptor(128, head_dim, wide),
                     kt_desc=_fp8_descriptor(head_dim, 128),
                     dq_desc=f"tensordesc<fp32[64, {half}],{tile_layout(64, half, torch.float32)!r}>",
                     Lse="*fp32", Delta="*fp32", DK="*fp32", DV="*bf16", QDescale="*fp32", KDescale="*fp32",
                     VDescale="*fp32", DODescale="*fp32",
                     **{name: "i32" for name in ("stride_gb", "stride_gm", "stride_gh", "stride_ds_b", "stride_ds_h",
                                                 "stride_ds_blk", "seqlen_q", "seqlen_k", "nheads", "nheads_k",
                                                 "key_blocks", "heads_per_section", "window_left",
                                                 "window_right")},
                     softmax_scale="fp32", qk_scale_log2="fp32")
    constexprs = {**hopper_fp8_dkdv_constexprs(head_dim, window_left, causal, fused=True),
                  **_fp8_sections(causal, window_left)}
    return _gluon_report(dkdv_dq_fp8_hopper_kernel, signature, constexprs)


def _fp8_sections(causal: bool, window_left: bool) -> dict:
    """The FP8 backward kernels' L2 sections where ``launch.backward_fp8`` passes none: the 1 it passes there is
    specialized into a constant."""
    return {} if causal and not window_left else {"heads_per_section": 1}


def _fp8_descriptor(rows: int, columns: int, wide: bool = False) -> str:
    """The signature type of a TMA descriptor of (rows, columns) e4m3 tiles (``wide``: their float16 copies')."""
    import torch

    from flashattn.launch.common import tile_layout

    dtype, name = (torch.float16, "fp16") if wide else (torch.float8_e4m3fn, "fp8e4nv")
    return f"tensordesc<{name}[{rows}, {columns}],{tile_layout(rows, columns, dtype)!r}>"


def hopper_dkdv_report(head_dim: int, causal: bool, config, fused: bool = False) -> dict:
    """:func:`report` of the Hopper dK/dV kernel (``kernels/backward_hopper.py``) with ``config``'s tile, as
    ``launch.backward._hopper_dkdv`` launches it for bf16 inputs (``fused``: the key-slice kernel's form that adds
    dQ^T into float32 by TMA reductions, ``kernels/backward_fused_dq.py``, the non-deterministic calls' kernel, or with
    ``config.persistent`` its persistent form, ``kernels/backward_fused_dq_persistent.py``; then
    ``ptx_reductions`` counts its PTX's TMA reductions and global red/atom instructions)."""

    from flashattn.launch.backward import (
        FUSED_DQ_TILE,
        dq_tile_layout,
        fused_persistent,
        hopper_dkdv_constexprs,
        hopper_dkdv_kernel,
    )

    fused_dq = config.key_slices and fused
    persistent = fused_dq and fused_persistent(config)
    kernel, keys = hopper_dkdv_kernel(config, fused_dq)
    dq_desc = f"tensordesc<fp32[{FUSED_DQ_TILE[0]}, {FUSED_DQ_TILE[1]}],{dq_tile_layout()!r}>"
    signature = dict(q_desc=_bf16_descriptor(config.block_m, head_dim, True),
                     k_desc=_bf16_descriptor(keys, head_dim, True),
                     v_desc=_bf16_descriptor(keys, head_dim, True),
                     do_desc=_bf16_descriptor(config.block_m, head_dim, True), Lse="*fp32", Delta="*fp32", DK="*bf16",
                     DV="*bf16", **(dict(dq_desc=dq_desc) if fused_dq else {}),
                     **(dict(TileCounter="*i32") if persistent else {}), stride_gb="i32", stride_gm="i32",
                     stride_gh="i32", seqlen_q="i32", seqlen_k="i32", nheads="i32", nheads_k="i32", key_blocks="i32",
                     batch_heads_k="i32", heads_per_section="i32", softmax_scale="fp32", qk_scale_log2="fp32")
    return _gluon_report(kernel, signature, hopper_dkdv_constexprs(config, head_dim, causal))


def hopper_dkdv_dq_report(head_dim: int, causal: bool, config) -> dict:
    """:func:`hopper_dkdv_report` of the fused dK/dV/dQ kernel."""
    return hopper_dkdv_report(head_dim, causal, config, fused=True)


def hopper_dq_report(head_dim: int, causal: bool, config, varlen: bool = False) -> dict:
    """:func:`report` of the Hopper dQ kernel (``kernels/dq_hopper.py``) with ``config``'s tile, as
    ``launch.backward._hopper_dq`` launches it for bf16 inputs."""
    from flashattn.kernels.dq_hopper import dq_hopper_kernel
    from flashattn.launch.backward import hopper_dq_constexprs

    seqlens = "*i32" if varlen else "*bf16"  # dense calls pass q there, never read
    dense = not varlen  # dense calls read through sequence descriptors
    signature = dict(q_desc=_bf16_descriptor(64, head_dim, dense),
                     k_desc=_bf16_descriptor(config.block_n, head_dim, dense),
                     v_desc=_bf16_descriptor(config.block_n, head_dim, dense),
                     do_desc=_bf16_descriptor(64, head_dim, dense), DQ="*bf16", Lse="*fp32", Delta="*fp32",
                     CuSeqlensQ=seqlens, CuSeqlensK=seqlens,
                     stride_dqm="i32", stride_dqh="i32", stride_lb="i32", stride_lh="i32", seqlen_q="i32",
                     seqlen_k="i32", nheads="i32", group_size="i32", row_tiles="i32", batch_heads="i32",
                     heads_per_section="i32", softmax_scale="fp32", qk_scale_log2="fp32")
    return _gluon_report(dq_hopper_kernel, signature, hopper_dq_constexprs(config, head_dim, causal, varlen))


def hopper_decode_report(head_dim: int, block_n: int, num_stages: int, new_keys: int = 1, paged: bool = False,
                         query_rows: int = 0, consumers: int = 1, early_first_block: bool = False) -> dict:
    """:func:`report` of the Hopper decode kernel (``kernels/decode_hopper.py``), as ``launch.decode._hopper_attention``
    launches it for bf16 inputs writing float32 partials (``new_keys``: the appended tokens, a power of two, 0 for none;
    ``paged``: a paged cache; ``query_rows``: swapped products over this many query rows, 0 for the padded rows;
    ``early_first_block``: the partitions read the sequence's length, an unsplit launch's build)."""
    from flashattn import configs
    from flashattn.kernels.decode_hopper import kvcache_decode_hopper_kernel

    kv_desc = _bf16_descriptor(block_n, head_dim)
    # the new keys' sequence descriptors, or the cache's (never read) without new keys
    new_desc = _bf16_descriptor(block_n, head_dim, sequences=True) if new_keys else kv_desc
    signature = dict(q_desc=_bf16_descriptor(query_rows or 64, head_dim), k_desc=kv_desc, v_desc=kv_desc,
                     kn_desc=new_desc, vn_desc=new_desc, Out="*fp32", Lse="*fp32", CacheSeqlens="*i32",
                     KCache="*bf16", VCache="*bf16", KNew="*bf16", VNew="*bf16", BlockTable="*i32",
                     Faults="*i32", stride_os="i32", stride_ob="i32", stride_oh="i32", stride_ls="i32", stride_lb="i32",
                     stride_lh="i32", stride_kcn="i32", stride_kch="i32", stride_knb="i32", stride_knn="i32",
                     stride_knh="i32", stride_btb="i32", nheads="i32", nheads_k="i32", capacity="i32",
                     num_splits="i32", seqlen_new="i32", extra_keys="i32", page_size="i32", num_pages="i32",
                     record_faults="i32", qk_scale_log2="fp32")
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=block_n, NUM_STAGES=num_stages,
                      LOADER_REGISTERS=configs.HOPPER_DECODE_LOADER_REGISTERS, NEW_KEYS=new_keys, PAGED=paged,
                      QUERY_ROWS=query_rows, CONSUMERS=consumers,
                      CONSUMER_REGISTERS=configs.HOPPER_DECODE_CONSUMER_REGISTERS,
                      EARLY_FIRST_BLOCK=early_first_block)
    return _gluon_report(kvcache_decode_hopper_kernel, signature, constexprs)


def _bf16_descriptor(rows: int, head_dim: int, sequences: bool = False) -> str:
    """The signature type of a host-side TMA descriptor of (rows, head_dim) bf16 tiles, as
    ``launch.common.token_descriptor`` builds it, or (``sequences``) of (1, rows, head_dim) boxes, as
    ``launch.common.sequence_descriptor`` does."""
    import torch

    from flashattn.launch.common import tile_layout

    box = f"1, {rows}, {head_dim}" if sequences else f"{rows}, {head_dim}"
    return f"tensordesc<bf16[{box}],{tile_layout(rows, head_dim, torch.bfloat16, sequences)!r}>"


def _gluon_report(kernel, signature: dict, constexprs: dict, options: dict | None = None) -> dict:
    """:func:`report` of a Hopper (Gluon) kernel compiled for sm90 with 4 warps in its default partition, its pointers
    and strides 16-divisible as the launcher's tensors make them (the JIT specializes on it: 16-byte stores)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = GluonASTSource(kernel, signature, constexprs, alignment_hints(signature))
    return report(*compile_sm90(source, {"num_warps": 4, **(options or {})}))


def quantize_report(head_dim: int, phase: str, group: int = 1, delta: bool = False) -> dict:
    """:func:`report` of the FP8 quantizer's ``phase`` kernel ("amax", "quantize" or "one_pass", the last for a kv
    head's ``group`` of query heads) as ``fp8.quantize`` launches it on bfloat16 rows of ``head_dim``, rotated, with
    block descales (``launch/quantize_fp8.py``); with ``delta``, as the FP8 backward quantizes dO (not rotated, delta
    from O in the same pass)."""
    from flashattn import configs
    from flashattn.kernels import quantize_fp8

    width = configs.padded_head_dim(head_dim)
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=width, BLOCK_ROWS=128, ROTATE=not delta, UPCAST=False)
    if phase != "amax":
        constexprs["DELTA"] = delta
    if phase == "one_pass":
        kernel = quantize_fp8.block_quantize_kernel
        _, depth, warps, stages = configs.QUANTIZE_ONE_PASS_TILES[width]
        constexprs.update(GROUP=group, TILE_ROWS=128 * configs.next_power_of_2(group), DEPTH=depth)
    else:
        kernel = {"amax": quantize_fp8.block_amax_kernel, "quantize": quantize_fp8.quantize_kernel}[phase]
        rows, cols, warps, stages = configs.QUANTIZE_TILES[width]
        constexprs.update(ROWS=rows, COLS=cols, **({"DESCALE": True} if phase == "amax" else {}))
    pointers = {"X": "*bf16", "S": "*bf16", "Out": "*fp8e4nv", "O": "*bf16", "e4m3_max": "fp32"}
    types = {name: "constexpr" if name in constexprs else pointers.get(name, "*fp32" if name[0].isupper() else "i32")
             for name in inspect.signature(kernel.fn).parameters}
    source = ASTSource(fn=kernel, signature=types, constexprs=constexprs, attrs=alignment_hints(types))
    return report(*compile_sm90(source, {"num_warps": warps, "num_stages": stages}))


def compile_report(kernel, num_warps: int, num_stages: int, constexprs: dict, dtype: str = "bf16",
                   aligned: bool = True, maxnreg: int | None = None, divisible: tuple[str, ...] = (),
                   descriptors: dict | None = None) -> dict:
    """Compile ``kernel`` for sm90 with these constexprs and launch options; :func:`report` of the result.

    ``maxnreg``: ptxas's register cap per thread, as ``TileConfig.max_registers`` passes it at launch.
    ``descriptors``: the signature types of the arguments that take host-side TMA descriptors.
    """
    types = {**signature(kernel, constexprs, dtype), **(descriptors or {})}
    source = ASTSource(fn=kernel, signature=types, constexprs=constexprs,
                       attrs=alignment_hints(types, divisible) if aligned else None)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return report(*compile_sm90(source, options))


if __name__ == "__main__":
    main(sys.argv[1:])
