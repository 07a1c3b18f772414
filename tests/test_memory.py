"""The attention-memory calculator against numbers worked out by hand.

The anchor is the seeds' exercise: Llama-2-70B (80 layers, 64 query heads), batch 1, seqlen 4096, bf16.
Per layer, S and P are 2 * 64 * 4096^2 * 2 bytes = 4 GiB; over 80 layers 320 GiB. flashattn's log-sum-exp
is 64 * 4096 * 4 bytes = 1 MiB per layer, 80 MiB in total. The saving factor is 4096.
"""

from __future__ import annotations

import argparse
import json

import pytest

from flashattn.tools import memory
from flashattn.tools.memory import GIB, KIB, MIB, ModelConfig, attention_memory, get_preset

LLAMA_2_70B = get_preset("llama-2-70b")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashattn memory")
    memory.add_arguments(parser)
    return parser.parse_args(list(argv))


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "shape"), [
    ("llama-2-7b", (32, 32, 32, 128, 4096)),
    ("llama-2-13b", (40, 40, 40, 128, 5120)),
    ("llama-2-70b", (80, 64, 8, 128, 8192)),
    ("llama-3-8b", (32, 32, 8, 128, 4096)),
    ("llama-3-70b", (80, 64, 8, 128, 8192)),
    ("mistral-7b", (32, 32, 8, 128, 4096)),
])
def test_presets_have_the_published_shapes(name, shape):
    config = get_preset(name)
    assert (config.layers, config.heads, config.kv_heads, config.head_dim, config.hidden) == shape


def test_preset_lookup_ignores_case():
    assert get_preset("Llama-2-70B") is get_preset("LLAMA-2-70b") is LLAMA_2_70B


def test_unknown_preset_lists_the_known_names():
    with pytest.raises(ValueError, match="model") as error:
        get_preset("gpt-5")
    for name in memory.PRESETS:
        assert name in str(error.value)


@pytest.mark.parametrize(("field", "value"), [("layers", 0), ("heads", -1), ("kv_heads", 3), ("head_dim", 1.5),
                                              ("hidden", True)])
def test_model_config_rejects_bad_shapes_naming_the_field(field, value):
    shape = {"layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64, "hidden": 256, field: value}
    with pytest.raises(ValueError, match=field):
        ModelConfig("bad", **shape)


# ---------------------------------------------------------------------------------------------
# The numbers
# ---------------------------------------------------------------------------------------------


def test_llama_2_70b_at_4096_tokens_training_matches_the_hand_computation():
    result = attention_memory(LLAMA_2_70B, batch=1, seqlen=4096, dtype="bfloat16", mode="training")
    assert result.standard.per_layer_items == {"scores": 2 * GIB, "probabilities": 2 * GIB}
    assert result.standard.per_layer_bytes == 2 * 1 * 64 * 4096**2 * 2 == 4 * GIB
    assert result.standard.total_bytes == 80 * 4 * GIB == 320 * GIB
    assert result.flashattn.per_layer_items == {"log_sum_exp": 64 * 4096 * 4}
    assert result.flashattn.per_layer_bytes == 1 * MIB
    assert result.flashattn.total_bytes == 80 * MIB
    assert result.ratio == 4096
    assert result.saved_bytes == 320 * GIB - 80 * MIB


def test_the_output_is_a_shared_item_outside_the_extra_memory():
    result = attention_memory(LLAMA_2_70B, 1, 4096, "bfloat16")
    assert result.output.per_layer_bytes == 1 * 4096 * 64 * 128 * 2 == 64 * MIB
    assert result.output.total_bytes == 80 * 64 * MIB
    assert "attention_output" not in result.standard.per_layer_items
    assert "attention_output" not in result.flashattn.per_layer_items


def test_inference_keeps_one_layer():
    training = attention_memory(LLAMA_2_70B, 1, 4096, "bfloat16", "training")
    inference = attention_memory(LLAMA_2_70B, 1, 4096, "bfloat16", "inference")
    assert inference.standard.per_layer_bytes == training.standard.per_layer_bytes == 4 * GIB
    assert inference.standard.total_bytes == 4 * GIB
    assert inference.flashattn.total_bytes == inference.flashattn.per_layer_bytes == 1 * MIB
    assert inference.ratio == training.ratio == 4096


def test_gqa_does_not_change_the_scores():
    """Llama-2-70B has 8 kv heads; the same model without GQA has identical attention memory."""
    without_gqa = ModelConfig("70B-MHA", layers=80, heads=64, kv_heads=64, head_dim=128, hidden=8192)
    with_gqa = attention_memory(LLAMA_2_70B, 2, 2048, "float16")
    mha = attention_memory(without_gqa, 2, 2048, "float16")
    assert with_gqa.standard == mha.standard
    assert with_gqa.flashattn == mha.flashattn
    assert with_gqa.output == mha.output


def test_dropout_adds_a_byte_per_score():
    result = attention_memory(LLAMA_2_70B, 1, 4096, "bfloat16", "training", dropout=True)
    mask = 1 * 64 * 4096**2
    assert result.standard.per_layer_items["dropout_mask"] == mask == 1 * GIB
    assert result.standard.per_layer_bytes == 5 * GIB
    assert result.standard.total_bytes == 400 * GIB
    assert result.flashattn.total_bytes == 80 * MIB  # no mask: flashattn regenerates it from a seed
    assert result.ratio == 5120


def test_scaling_batch_dtype_and_seqlen():
    """Standard memory is linear in batch and dtype size and quadratic in seqlen; flashattn's is linear in
    batch and seqlen, and float32 whatever the dtype."""
    config = get_preset("llama-3-8b")  # 32 layers, 32 heads
    base = attention_memory(config, 1, 1024, "bfloat16")
    assert base.standard.per_layer_bytes == 2 * 32 * 1024**2 * 2 == 128 * MIB
    assert base.flashattn.per_layer_bytes == 32 * 1024 * 4 == 128 * KIB
    bigger = attention_memory(config, 3, 2048, "float32")
    assert bigger.standard.per_layer_bytes == base.standard.per_layer_bytes * 3 * 4 * 2
    assert bigger.flashattn.per_layer_bytes == base.flashattn.per_layer_bytes * 3 * 2
    assert bigger.ratio == 4096  # 2 matrices x 4 bytes x N / 4 bytes


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"batch": 0}, "batch"),
    ({"batch": 1.0}, "batch"),
    ({"seqlen": -4}, "seqlen"),
    ({"seqlen": True}, "seqlen"),
    ({"dtype": "int8"}, "dtype"),
    ({"mode": "serving"}, "mode"),
    ({"dropout": 0.1}, "dropout"),
    ({"mode": "inference", "dropout": True}, "dropout"),
])
def test_bad_arguments_are_value_errors_naming_the_argument(kwargs, argument):
    arguments = {"config": LLAMA_2_70B, "batch": 1, "seqlen": 128, **kwargs}
    with pytest.raises(ValueError, match=argument) as error:
        attention_memory(**arguments)
    assert error.value.argument == argument


def test_dtype_aliases_are_accepted():
    assert attention_memory(LLAMA_2_70B, 1, 128, "bf16").dtype == "bfloat16"
    assert attention_memory(LLAMA_2_70B, 1, 128, "FP32").dtype_bytes == 4


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (1023, "1023 B"), (KIB, "1.00 KiB"), (256 * KIB, "256 KiB"), (MIB, "1.00 MiB"),
    (80 * MIB, "80.0 MiB"), (4 * GIB, "4.00 GiB"), (320 * GIB, "320 GiB"), (20 * 1024 * GIB, "20.0 TiB"),
])
def test_format_bytes(count, text):
    assert memory.format_bytes(count) == text


def test_table_rows_hold_the_hand_computed_numbers():
    results = memory.memory_table(LLAMA_2_70B, [1024, 4096])
    table = memory.render_table(results)
    lines = table.splitlines()
    assert "Llama-2-70B" in lines[0] and "training" in lines[0] and "bfloat16" in lines[0]
    assert lines[1].split() == ["seqlen", "standard", "per", "layer", "standard", "total", "flashattn", "per",
                                "layer", "flashattn", "total", "ratio"]
    row_4096 = next(line for line in lines if line.split()[:1] == ["4096"])
    assert row_4096.split() == ["4096", "4.00", "GiB", "320", "GiB", "1.00", "MiB", "80.0", "MiB", "4096x"]
    row_1024 = next(line for line in lines if line.split()[:1] == ["1024"])
    assert row_1024.split() == ["1024", "256", "MiB", "20.0", "GiB", "256", "KiB", "20.0", "MiB", "1024x"]
    assert "80 layers" in table and "GQA" in table


def test_table_notes_the_gpu_memory():
    table = memory.render_table(memory.memory_table(LLAMA_2_70B, [1024, 2048, 4096]), 80 * GIB)
    assert "GPU memory 80.0 GiB" in table
    assert "standard attention alone fills it from seqlen 2048" in table
    assert "flashattn at none of these seqlens" in table


def test_json_shape_and_values():
    results = memory.memory_table(LLAMA_2_70B, [4096, 8192], dropout=True)
    data = json.loads(json.dumps(memory.to_json(results, gpu_memory_bytes=80 * GIB)))  # plain, serializable
    assert data["model"] == {"name": "Llama-2-70B", "layers": 80, "heads": 64, "kv_heads": 8, "head_dim": 128,
                             "hidden": 8192}
    assert (data["batch"], data["dtype"], data["dtype_bytes"], data["mode"], data["dropout"]) == (
        1, "bfloat16", 2, "training", True)
    assert data["gpu_memory_bytes"] == 80 * GIB
    assert [row["seqlen"] for row in data["rows"]] == [4096, 8192]
    row = data["rows"][0]
    assert set(row) == {"seqlen", "standard", "flashattn", "shared_output", "ratio", "saved_bytes"}
    assert row["standard"] == {"per_layer_bytes": 5 * GIB, "layers_alive": 80, "total_bytes": 400 * GIB,
                               "per_layer_items": {"scores": 2 * GIB, "probabilities": 2 * GIB,
                                                   "dropout_mask": 1 * GIB}}
    assert row["flashattn"] == {"per_layer_bytes": MIB, "layers_alive": 80, "total_bytes": 80 * MIB,
                                "per_layer_items": {"log_sum_exp": MIB}}
    assert row["shared_output"]["per_layer_bytes"] == 64 * MIB
    assert row["ratio"] == 5120


def test_results_of_different_settings_do_not_share_a_table():
    mixed = [attention_memory(LLAMA_2_70B, 1, 1024), attention_memory(LLAMA_2_70B, 2, 2048)]
    with pytest.raises(ValueError, match="results"):
        memory.render_table(mixed)


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "memory.png"
    written = memory.plot_memory(LLAMA_2_70B, [1024, 4096, 16384], path, gpu_memory_bytes=80 * GIB, gpu_label="H100")
    assert written == path
    assert path.read_bytes().startswith(b"\x89PNG")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    """The default GPU memory comes from CUDA when there is one; these tests want none."""
    monkeypatch.setattr(memory, "detected_gpu", lambda: None)


def test_run_prints_the_table_at_the_default_seqlens(capsys, no_gpu):
    assert memory.run(parse("--model", "Llama-2-70B")) == 0
    out = capsys.readouterr().out
    seqlens = [line.split()[0] for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert seqlens == [str(n) for n in memory.DEFAULT_SEQLENS]
    assert "320 GiB" in out and "4096x" in out


def test_run_json_with_explicit_shapes(capsys, no_gpu):
    argv = ("--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--seqlens", "8,16",
            "--batch", "3", "--dtype", "float32", "--mode", "inference", "--json")
    assert memory.run(parse(*argv)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["name"] == "custom" and data["model"]["hidden"] == 64
    assert data["mode"] == "inference" and "gpu_memory_bytes" not in data
    assert [row["standard"]["total_bytes"] for row in data["rows"]] == [2 * 3 * 4 * 8**2 * 4, 2 * 3 * 4 * 16**2 * 4]


def test_run_writes_the_plot_and_keeps_json_clean(tmp_path, capsys, no_gpu):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    assert memory.run(parse("--model", "mistral-7b", "--seqlens", "1024", "2048", "--gpu-memory-gb", "80",
                            "--json", "--plot", str(path))) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["gpu_memory_bytes"] == 80 * GIB
    assert path.exists() and str(path) in captured.err


@pytest.mark.parametrize(("argv", "flag"), [
    (("--model", "gpt-5"), "--model"),
    ((), "--model"),
    (("--model", "llama-2-7b", "--layers", "4"), "--model"),
    (("--layers", "2", "--heads", "4"), "--head-dim"),
    (("--layers", "2", "--heads", "4", "--head-dim", "8", "--kv-heads", "3"), "--kv-heads"),
    (("--model", "llama-2-7b", "--mode", "inference", "--dropout"), "--dropout"),
])
def test_run_errors_exit_2_naming_the_flag(argv, flag, capsys, no_gpu):
    assert memory.run(parse(*argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashattn memory: error: ") and flag in err


@pytest.mark.parametrize("argv", [("--batch", "0"), ("--seqlens", "abc"), ("--dtype", "int8"),
                                  ("--mode", "serving"), ("--gpu-memory-gb", "-80")])
def test_bad_flag_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err
