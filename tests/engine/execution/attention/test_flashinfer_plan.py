"""The FlashInfer planner: page tables to int32 CSR on the host, window_left, which wrapper,
which layers share a plan, and which models FlashInfer cannot run (pure; no FlashInfer)."""
from __future__ import annotations

import pytest
import torch

from engine.execution.attention import flashinfer_plan as fp


def test_page_csr_takes_the_pages_each_length_needs() -> None:
    csr = fp.page_csr([[7, 3, 9], [4], [2, 5, 8, 1]], [5, 4, 9], page_size=4)
    assert csr.indptr == [0, 2, 3, 6]  # 5 positions: 2 pages; the spare third is left out
    assert csr.indices == [7, 3, 4, 2, 5, 8]
    assert csr.last_page_len == [1, 4, 1]


def test_page_csr_with_one_position_pages() -> None:
    csr = fp.page_csr([[3, 1, 2]], [3], page_size=1)
    assert (csr.indptr, csr.indices, csr.last_page_len) == ([0, 3], [3, 1, 2], [1])


@pytest.mark.parametrize(("tables", "lens"), [([[1]], [5]), ([[1, 2]], [0]), ([[1]], [])])
def test_page_csr_refuses_tables_that_do_not_cover(tables: list[list[int]],
                                                   lens: list[int]) -> None:
    with pytest.raises(ValueError):
        fp.page_csr(tables, lens, page_size=4)


def test_window_left_is_the_window_less_the_query_itself() -> None:
    assert fp.window_left(None) == -1
    assert fp.window_left(4096) == 4095
    assert fp.window_left(1) == 0
    with pytest.raises(ValueError):
        fp.window_left(0)


def test_layers_of_one_pool_and_window_share_a_plan() -> None:
    kinds, of_layer = fp.layer_kinds([(True, 512), (False, None), (True, 512), (True, 1024),
                                      (False, None)])
    assert kinds == [fp.LayerKind(True, 511), fp.LayerKind(False, -1),
                     fp.LayerKind(True, 1023)]
    assert of_layer == [0, 1, 0, 2, 1]


def test_query_offsets_and_the_wrapper_of_a_round() -> None:
    assert fp.qo_indptr([1, 1, 5, 3]) == [0, 1, 2, 7, 10]
    assert fp.wrapper_for([1, 1, 1]) == "decode"
    assert fp.wrapper_for([1, 1, 2]) == "prefill"
    assert fp.use_tensor_cores(32, 4) and not fp.use_tensor_cores(16, 4)


def test_what_flashinfer_cannot_run() -> None:
    assert fp.unsupported("cuda", 64, torch.bfloat16) is None
    assert fp.unsupported("cuda", 128, torch.float16) is None
    assert "CUDA" in (fp.unsupported("cpu", 64, torch.bfloat16) or "")
    assert "float32" in (fp.unsupported("cuda", 64, torch.float32) or "")
    assert "head sizes" in (fp.unsupported("cuda", 96, torch.bfloat16) or "")
    assert "head sizes" in (fp.unsupported("cuda", 16, torch.bfloat16) or "")
