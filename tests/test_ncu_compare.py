"""benchmarks/ncu_compare.py's pure parts: the case fields, the per-opcode table and the stall hot spots from ncu's
source page."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import ncu_compare  # noqa: E402

SOURCE_PAGE = "\n".join([
    '"Kernel Name","attention_forward_hopper_kernel",',
    '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"',
    '"0x10","      FMNMX R3, R4, R3, !PT","30","1,000"',
    '"0x20","@!P0  BRA 0x40","10","200"',
    '"0x30","      FMNMX R4, R3, R4, !PT","20","1,000"',
    '"0x40","      MUFU.EX2 R2, R28","40","500"',
])


def test_opcode_profile_sums_executions_and_stall_shares_per_mnemonic():
    profile = ncu_compare.opcode_profile(SOURCE_PAGE)
    assert profile == {"FMNMX": (2000.0, 0.5), "BRA": (200.0, 0.1), "MUFU": (500.0, 0.4)}
    assert ncu_compare.opcode_profile("no source page") == {}


STALL_PAGE = "\n".join([
    '"Kernel Name","dkdv_dq_key_slices_kernel",',
    '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb",'
    '"stall_barrier (Not Issued)"',
    '"0x7f0000001000","      HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24","10","0","2","0"',
    '"0x7f0000001010","      BAR.SYNC.DEFER_BLOCKING 0x1, 0x80","60","54","0","54"',
    '"0x7f0000001020","@!P0  BRA 0x7f0000001000","30","0","24","0"',
])


def test_stall_hotspots_rank_instructions_by_samples_with_their_reasons():
    hot = ncu_compare.stall_hotspots(STALL_PAGE, rows=2)
    assert hot == [("0x0010", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80", 0.6, "barrier 90%"),
                   ("0x0020", "@!P0 BRA 0x7f0000001000", 0.3, "long_sb 80%")]
    assert ncu_compare.stall_hotspots("no source page") == []


def test_opcode_table_sets_the_cases_side_by_side():
    ours = ncu_compare.opcode_profile(SOURCE_PAGE)
    theirs = {"FMNMX": (1.5e6, 0.25), "SHFL": (4e5, 0.75)}
    table = ncu_compare.opcode_table(["ours", "fa4"], [ours, theirs]).splitlines()
    assert table[0] == "| opcode | ours: M executed, stalls | fa4: M executed, stalls |"
    assert table[2] == "| FMNMX | 0.0, 50.0% | 1.5, 25.0% |"  # the most executed in any case first
    assert table[3] == "| SHFL | - | 0.4, 75.0% |"
    assert table[-1] == "| all | 0.0 | 1.9 |"


def test_cases_name_their_provider_and_kernel():
    name, fields = ncu_compare.parse_case("fa4:hdim=128,seqlen=16384,provider=fa4,kernel=regex:Sm90")
    assert (name, fields["provider"], fields["kernel"]) == ("fa4", "fa4", "regex:Sm90")
    with pytest.raises(SystemExit, match="provider must be"):
        ncu_compare.parse_case("x:provider=fa3")
    assert ncu_compare.parse_case("c:provider=cudnn,causal=1")[1]["provider"] == "cudnn"
    for provider in ("fa4", "cudnn"):
        with pytest.raises(SystemExit, match="no varlen, window or forced tile"):
            ncu_compare.parse_case(f"x:provider={provider},varlen=1")
    with pytest.raises(SystemExit, match="unknown fields"):
        ncu_compare.parse_case("x:heads=4")
    assert ncu_compare.parse_case("fp8:hdim=128,dtype=fp8,causal=1")[1]["dtype"] == "fp8"
    with pytest.raises(SystemExit, match="dtype must be"):
        ncu_compare.parse_case("x:dtype=fp16")
    for case in ("x:dtype=fp8,mode=bwd", "x:dtype=fp8,provider=cudnn"):
        with pytest.raises(SystemExit, match="no bwd, fa4 or cudnn, varlen"):
            ncu_compare.parse_case(case)
