"""benchmarks/sass_report.idle_barriers on hand-written TTGIR: a barrier that is only initialized is flagged (the
compiler reuses its memory while it holds an initialized mbarrier); one used through a view of its array, or handed to
a partition, is not, nor is a name that merely starts with a barrier's."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from sass_report import idle_barriers  # noqa: E402

BARRIER = "!ttg.memdesc<1xi64, #shared2, #smem, mutable>"


def test_a_barrier_only_initialized_is_idle():
    ttgir = f"""
    %ready = ttg.local_alloc : () -> !ttg.memdesc<2x1xi64, #shared2, #smem, mutable> loc(#loc1)
    %0 = ttg.memdesc_index %ready[%c0_i32] : !ttg.memdesc<2x1xi64, #shared2, #smem, mutable> -> {BARRIER}
    ttng.init_barrier %0, 1 : {BARRIER} loc(#loc2)
    %landed = ttg.local_alloc : () -> {BARRIER} loc(#loc3)
    ttng.init_barrier %landed, 1 : {BARRIER} loc(#loc4)
    %landed_1 = arith.constant 0 : i32 loc(#loc5)
    %slot = ttg.local_alloc : () -> !ttg.memdesc<1x1xi32, #shared2, #smem, mutable> loc(#loc6)
    ttng.wait_barrier %0, %landed_1, %true : {BARRIER} loc(#loc7)
    """
    assert idle_barriers(ttgir) == ["%landed"]


def test_a_barrier_handed_to_a_partition_is_used():
    ttgir = f"""
    %landed = ttg.local_alloc : () -> {BARRIER} loc(#loc3)
    ttng.init_barrier %landed, 1 : {BARRIER} loc(#loc4)
    ttg.warp_specialize(%q_desc, %landed, %tile_slot) attributes {{requestedRegisters = array<i32: 24>}}
    """
    assert idle_barriers(ttgir) == []
