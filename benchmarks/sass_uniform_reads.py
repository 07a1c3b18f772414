"""Reads of uniform registers that some path to them leaves unwritten, in a kernel's SASS (``cuobjdump -sass``): a
must-be-written analysis over the control-flow graph from the function's entry.

ptxas 12.8 (Triton 3.6) computed the Hopper forward's Q descriptors for the masked run of key blocks inside the
whole-block run's first product, and reused them when that run did not execute: a tile with no whole key block read
Q through the descriptors of an earlier tile, another Q buffer (docs/perf-notes.md). Such a read shows here without
running the kernel; tests/test_sm90_compile.py counts them for every build of the Hopper kernels
(``sass_report.report_cubin``).

    python3 benchmarks/sass_uniform_reads.py KERNEL.sass
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_UNIFORM = re.compile(r"\bUR(\d+)\b")
_DESCRIPTORS = re.compile(r"gdesc\[UR(\d+)\]")  # a wgmma's A and B descriptors: four uniform registers
_GENERAL = re.compile(r"^R\d+$")
_BRANCH_TARGET = re.compile(r"\b(?:BRA|JMP)\b.*?(0x[0-9a-f]+)")
_PREDICATE = re.compile(r"^!?U?P(\d+|T)$")
_ENDS_FLOW = re.compile(r"^(?:BRA|EXIT|RET|JMP)\b")  # unpredicated: nothing falls through


def _parse(sass: str) -> list[tuple[int, str]]:
    return [(int(address, 16), text) for address, text in _LINE.findall(sass)]


def _effects(text: str) -> tuple[set[int], set[int]]:
    """(uniform registers written, uniform registers read) by one instruction; the first operand is the destination
    unless it is an address. A predicated write counts as a write: ptxas if-converts short branches into predicated
    pairs whose reads are guarded like their writes, which a path analysis cannot follow."""
    if text.startswith("@"):
        text = text.split(None, 1)[1]
    opcode, _, rest = text.partition(" ")
    written: set[int] = set()
    read: set[int] = set()
    operands = [part.strip() for part in rest.split(",") if part.strip()]
    # a predicate written beside the destination comes first (R2UR P1, UR6, R5)
    first_register = next((i for i, operand in enumerate(operands) if not _PREDICATE.match(operand)), 0)
    for index, operand in enumerate(operands):
        for match in _DESCRIPTORS.finditer(operand):
            base = int(match.group(1))
            # A from registers (HGMMA R88, R152, gdesc[UR8].tnspB): only B's half, UR10-11, is read
            a_in_registers = index > 1 and _GENERAL.match(operands[index - 1])
            read.update(range(base + 2 if a_in_registers else base, base + 4))
        registers = {int(n) for n in _UNIFORM.findall(_DESCRIPTORS.sub("", operand))}
        destination = _UNIFORM.match(operand) if index == first_register else None
        if destination:
            first = int(destination.group(1))
            written.update({first, first + 1} if ".64" in opcode or ".WIDE" in opcode else {first})
        elif not destination:
            read |= registers
    return written, read - {255}  # UR255 is URZ's number


def _blocks(code: list[tuple[int, str]]) -> tuple[list[range], list[set[int]]]:
    """Basic blocks (ranges of instruction indices) and each one's successors."""
    index_of = {address: i for i, (address, _) in enumerate(code)}
    leaders = {0}
    for i, (_, text) in enumerate(code):
        target = _BRANCH_TARGET.search(text)
        if target or _ENDS_FLOW.match(text.split(None, 1)[-1] if text.startswith("@") else text):
            leaders.add(i + 1)
        if target and int(target.group(1), 16) in index_of:
            leaders.add(index_of[int(target.group(1), 16)])
    starts = sorted(i for i in leaders if i < len(code))
    blocks = [range(start, end) for start, end in zip(starts, starts[1:] + [len(code)], strict=True)]
    block_at = {block.start: b for b, block in enumerate(blocks)}
    successors = []
    for block in blocks:
        last = code[block[-1]][1]
        following = set()
        target = _BRANCH_TARGET.search(last)
        if target and int(target.group(1), 16) in index_of:
            following.add(block_at[index_of[int(target.group(1), 16)]])
        if not _ENDS_FLOW.match(last) and block.stop < len(code):
            following.add(block_at[block.stop])
        successors.append(following)
    return blocks, successors


def unwritten_reads(sass: str) -> list[tuple[int, str, list[int]]]:
    """(address, instruction, registers) for each read of a uniform register that some path leaves unwritten."""
    code = _parse(sass)
    if not code:
        return []
    effects = [_effects(text) for _, text in code]
    blocks, successors = _blocks(code)
    entry_state: list[set[int] | None] = [None] * len(blocks)  # None: no path reaches it yet
    entry_state[0] = set()
    pending = [0]
    while pending:
        b = pending.pop()
        state = set(entry_state[b])
        for i in blocks[b]:
            state |= effects[i][0]
        for s in successors[b]:
            merged = state if entry_state[s] is None else entry_state[s] & state
            if merged != entry_state[s]:
                entry_state[s] = merged
                pending.append(s)
    found = []
    for b, block in enumerate(blocks):
        if entry_state[b] is None:
            continue
        state = set(entry_state[b])
        for i in block:
            written, read = effects[i]
            missing = sorted(read - state)
            if missing:
                found.append((code[i][0], code[i][1], missing))
            state |= written
    return found


def main(path: str) -> None:
    found = unwritten_reads(Path(path).read_text())
    for address, text, missing in found[:40]:
        print(f"{address:#07x}  {text}   <- UR{', UR'.join(map(str, missing))} not written on every path")
    print(f"{len(found)} reads of uniform registers that some path leaves unwritten")


if __name__ == "__main__":
    main(sys.argv[1])
