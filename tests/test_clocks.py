"""The SM clock and power sampler beside the bench (flashattn/clocks.py): its parser, its windows, and the sampling
process, here with a stand-in ``nvidia-smi`` on the PATH (the real one exists only on the GPU machine)."""

from __future__ import annotations

import os
import stat
import time

import torch

from flashattn.tools import clocks


def test_parse_sample_reads_clock_and_power_and_skips_the_rest():
    assert clocks.parse_sample("1980, 612.34\n") == (1980.0, 612.34)
    assert clocks.parse_sample("[N/A], 612.34") is None
    assert clocks.parse_sample("clocks.current.sm [MHz], power.draw [W]") is None
    assert clocks.parse_sample("") is None


def test_window_summarizes_only_the_samples_inside_it():
    monitor = clocks.ClockMonitor(torch.device("cpu"))
    monitor.samples = [(1.0, 1980.0, 300.0), (2.0, 1700.0, 690.0), (3.0, 1800.0, 650.0), (4.0, 1500.0, 100.0)]
    assert monitor.window(1.5, 3.5) == (1750.0, 690.0)
    assert monitor.window(5.0, 6.0) == (None, None)


def test_off_the_gpu_nothing_is_sampled():
    with clocks.ClockMonitor(torch.device("cpu")) as monitor:
        time.sleep(0.05)
    assert monitor.samples == []
    assert monitor.window(0.0, time.monotonic()) == (None, None)


def test_samples_come_from_nvidia_smi_while_the_block_runs(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\nwhile true; do echo "1755, 650.5"; echo "1965, 480.0"; sleep 0.02; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    started = time.monotonic()
    with clocks.ClockMonitor(torch.device("cuda", 0)) as monitor:
        deadline = time.monotonic() + 5
        while len(monitor.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    ended = time.monotonic()
    assert len(monitor.samples) >= 4
    mhz, watts = monitor.window(started, ended)
    assert 1755.0 <= mhz <= 1965.0 and watts == 650.5
    count = len(monitor.samples)
    time.sleep(0.1)
    assert len(monitor.samples) == count  # the process is gone after the block
