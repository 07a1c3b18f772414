"""Compile one flashattn kernel for sm90 on a machine without a GPU and report what ptxas made of it.

Triton runs its whole MLIR pipeline and ptxas (both ship in the triton wheel) for a ``GPUTarget``, so
registers, stack (spills), shared memory, warps and the instruction mix (HGMMA vs HMMA, FP ops) can be
read on the CPU machine before any device time is spent. Unspecified constexprs default to False,
pointers to *bf16 (Lse/Delta/AlibiSlopes *fp32, CuSeqlens* *i32), other arguments to i32.

    PYTHONPATH=src python benchmarks/sass_report.py flashattn.kernels.forward:attention_forward_kernel 8 3 \\
        HEAD_DIM=128 BLOCK_D=128 BLOCK_M=128 BLOCK_N=128 DOT_PRECISION='"tf32"' USE_TMA=True
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = triton.__path__[0] + "/backends/nvidia/bin/"
FLOAT_ARGS = {"softmax_scale", "qk_scale", "softcap_log2", "dropout_p"}
FP32_POINTERS = {"Lse", "Delta", "AlibiSlopes", "DMask"}
COUNTED_OPS = ("HGMMA", "HMMA", "FFMA", "FMUL", "FADD", "MUFU.EX2", "STL", "LDL")


def signature(kernel, constexprs: dict, dtype: str) -> dict:
    types = {}
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if "constexpr" in str(param.annotation):
            constexprs.setdefault(name, param.default if param.default is not inspect.Parameter.empty else False)
            types[name] = "constexpr"
        elif name in FLOAT_ARGS:
            types[name] = "fp32"
        elif name.startswith("CuSeqlens"):
            types[name] = "*i32"
        elif name[0].isupper():
            types[name] = "*fp32" if name in FP32_POINTERS else f"*{dtype}"
        else:
            types[name] = "i32"
    return types


def report(compiled) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([BIN + "cuobjdump", "-sass", cubin.name], capture_output=True, text=True).stdout
        usage = subprocess.run([BIN + "cuobjdump", "-res-usage", cubin.name], capture_output=True, text=True).stdout
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return {
        "registers": int(registers.group(1)) if registers else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "shared_bytes": compiled.metadata.shared,
        "warps": compiled.metadata.num_warps,
        **{op: len(re.findall(r"\b" + re.escape(op) + r"\b", sass)) for op in COUNTED_OPS},
    }


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    module, name = argv[0].split(":")
    kernel = getattr(importlib.import_module(module), name)
    num_warps, num_stages = int(argv[1]), int(argv[2])
    constexprs = {key: ast.literal_eval(value) for key, value in (arg.split("=", 1) for arg in argv[3:])}
    dtype = constexprs.pop("dtype", "bf16")
    start = time.time()
    source = ASTSource(fn=kernel, signature=signature(kernel, constexprs, dtype), constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    print(f"{' '.join(argv[1:])}: {report(compiled)} ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
