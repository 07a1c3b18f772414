"""benchmarks/sass_uniform_reads.py on small hand-written SASS: the shapes it must flag (a uniform register written
on one side of a fork and read after the two paths join, ptxas 12.8's fault in the Hopper forward) and those it must
not (written before the fork, on both sides, by a predicated pair, beside a predicate)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import sass_uniform_reads  # noqa: E402


def sass(*lines: str) -> str:
    """cuobjdump's layout: an address comment, the instruction, its encoding."""
    return "\n".join(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0 */" for i, text in enumerate(lines))


def flagged(*lines: str) -> list[tuple[int, list[int]]]:
    return [(address, registers) for address, _, registers in sass_uniform_reads.unwritten_reads(sass(*lines))]


def test_a_descriptor_written_in_one_branch_and_read_after_the_join():
    # Q's address and K's descriptor first; 0x30: skip the first run (0x40-0x50 write Q's descriptor, UR36-37) to
    # 0x60, the masked run's product, which reads all four
    assert flagged("UMOV UR51, 0x10", "UMOV UR38, 0x20", "UMOV UR39, 0x40000040", "@!P1 BRA 0x60",
                   "UIADD3 UR36, UP1, UR51, 0x2, URZ", "UMOV UR37, 0x40000040",
                   "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR36], R24", "EXIT") == [(0x60, [36, 37])]


def test_a_register_read_where_it_was_never_written():
    assert flagged("UMOV UR40, UR36", "EXIT") == [(0x00, [36])]


def test_written_before_the_branch_or_on_both_sides():
    assert flagged("UMOV UR36, 0x1", "@!P1 BRA 0x30", "UMOV UR4, 0x2", "BRA 0x40", "UMOV UR4, 0x3",
                   "UIADD3 UR5, UR36, UR4, URZ", "EXIT") == []


def test_a_loop_that_writes_before_it_reads():
    assert flagged("UMOV UR8, 0x0", "UIADD3 UR8, UR8, 0x1, URZ", "UISETP.GE.AND UP0, UPT, UR8, 0x4, UPT",
                   "@!UP0 BRA 0x10", "EXIT") == []


def test_predicated_pairs_and_predicate_destinations():
    # ptxas's if-conversion writes and reads under one predicate; R2UR may write a predicate before its register
    assert flagged("@!UP3 UIMAD UR57, UR11, -0x7ff8, UR14", "@!UP3 UIADD3 UR57, UR57, 0x34050, URZ",
                   "@P2 R2UR P1, UR6, R5", "SYNCS.EXCH.64 URZ, [UR6+0x34040], UR4", "EXIT") == [(0x00, [11, 14]),
                                                                                                   (0x30, [4])]


def test_wide_and_64_bit_writes_cover_two_registers():
    assert flagged("UIADD3.64 UR18, UR42, 0x2, URZ", "UMOV UR20, UR19", "EXIT") == [(0x00, [42])]


def test_a_product_with_a_from_registers_reads_only_b_descriptor():
    # P V: P in R152-R155, V's descriptor in UR10-11; UR8-9, A's half of the four, are never read
    assert flagged("UMOV UR10, 0x20", "UMOV UR11, 0x40000040",
                   "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88", "EXIT") == []
    assert flagged("UMOV UR10, 0x20", "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88",
                   "EXIT") == [(0x10, [11])]
