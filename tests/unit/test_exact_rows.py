"""Exact batches' rows, as the kernels allow them, without a model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import localspec.llama.model as llama_model
from localspec.errors import Unsupported
from localspec.llama.model import TILED_MIN_ROWS, Build, exact_rows


def _model(types: set[int], gpu_layers: int = 0, flash_attn: bool = False) -> Any:  # a Model, as exact_rows reads it
    return SimpleNamespace(tensor_types=frozenset(types), n_gpu_layers=gpu_layers, flash_attn=flash_attn)


def test_exact_rows_follow_the_kernels_and_name_what_stops_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """K-quant weights: below the tiled matmul's 8 rows; Q8_0/F16: any batch; refused with llamafile's kernels
    built in, layers on a GPU, or flash attention, each naming its fix."""

    def built(info: str, gpu: bool = False) -> None:
        monkeypatch.setattr(llama_model, "build", lambda: Build("0", info, gpu))

    built("CPU : AVX2 = 1 | REPACK = 1 |")
    assert exact_rows(_model({0, 12, 14})) == TILED_MIN_ROWS - 1  # Q4_K_M
    assert exact_rows(_model({0, 8})) is None and exact_rows(_model({0, 1})) is None  # Q8_0, F16
    assert exact_rows(_model({12}, gpu_layers=99)) == TILED_MIN_ROWS - 1  # a CPU-only build offloads nothing
    for model, info, gpu, words in [
        (_model({12}), "CPU : AVX2 = 1 | LLAMAFILE = 1 |", False, "GGML_LLAMAFILE=OFF"),
        (_model({12}, gpu_layers=99), "CUDA : ARCHS = 900 |", True, "--gpu-layers 0"),
        (_model({12}, flash_attn=True), "CPU : AVX2 = 1 |", False, "flash attention"),
    ]:
        built(info, gpu)
        with pytest.raises(Unsupported, match=words) as e:
            exact_rows(model)
        assert e.value.param == "exact"
