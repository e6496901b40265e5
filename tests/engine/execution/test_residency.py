"""Reading resident pages: mincore for anonymous tensors, smaps for a mapped file's pages."""
from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from engine.execution.residency import Footprint, mapped, resident, storages, weights_resident

MB = 1 << 20
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_written_pages_of_a_tensor_count_and_views_count_once() -> None:
    t = torch.empty(32 * MB, dtype=torch.uint8, device="cpu")
    t.fill_(1)  # every page written: resident
    whole = resident(storages([t]))
    assert 31 * MB <= whole <= 33 * MB
    # a view of the same storage and an overlapping range add nothing
    assert resident(storages([t, t[:MB]]) + [(t.data_ptr(), 4096)]) == whole


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")
def test_a_mapped_file_counts_the_pages_this_process_read(tmp_path: Path) -> None:
    path = tmp_path / "blocks.bin"
    path.write_bytes(b"\1" * (16 * MB))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        ranges, before = mapped(str(path))
        assert sum(n for _, n in ranges) == 16 * MB
        assert before < 4 * MB  # mapped, not yet read (the page cache holds it: mincore would)
        total = sum(m[i] for i in range(0, 8 * MB, 4096))  # read half the pages
        assert total == 8 * MB // 4096
        _, after = mapped(str(path))
        assert 7 * MB <= after - before <= 9 * MB
        # tensors inside the map are the map's pages, not counted again
        view = torch.frombuffer(m, dtype=torch.uint8, count=MB)
        assert weights_resident([view], str(path)) == after
        del view  # before the map closes


def test_footprint_adds_its_parts() -> None:
    parts = Footprint(weights=5, kv=4, tokenizer=3, vocabulary=2, other=1)
    assert parts.total == 15 and parts.as_dict()["total"] == 15
    assert parts.line().startswith("0 MB: weights 0, KV 0")


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")
def test_pages_no_tensor_lies_on_leave_the_process_and_read_back(tmp_path: Path) -> None:
    from engine.execution.residency import release_unused_file_pages

    path = tmp_path / "blocks.bin"
    path.write_bytes(bytes(range(256)) * (16 * MB // 256))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        assert sum(m[i] for i in range(0, 16 * MB, 4096)) == 0  # every page read: resident
        _, before = mapped(str(path))
        assert before >= 15 * MB
        kept = torch.frombuffer(m, dtype=torch.uint8, count=4 * MB, offset=MB)
        released = release_unused_file_pages(str(path), [kept])
        _, after = mapped(str(path))
        # all but the tensor's 4 MB (the kernel may reclaim clean file pages too, any time)
        assert released == 12 * MB and after <= before - 11 * MB
        # the dropped pages read back from the file, unchanged
        assert m[12 * MB + 7] == 7 and m[0] == 0 and int(kept[3]) == 3
        del kept


def test_a_range_read_from_a_file_leaves_the_process(tmp_path: Path) -> None:
    """release_file_range drops the whole pages of a range inside the file's maps (what
    loading has copied into blocks), reads them back unchanged, and leaves other memory
    alone."""
    from engine.execution.residency import release_file_range

    path = tmp_path / "tower.bin"
    path.write_bytes(bytes(range(256)) * (8 * MB // 256))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert sum(m[i] for i in range(0, 8 * MB, 4096)) == 0  # every page read
        maps, before = mapped(str(path))
        start = maps[0][0]
        released = release_file_range(maps, start + MB + 100, 4 * MB)
        _, after = mapped(str(path))
        assert released == 4 * MB - 4096  # whole pages only: not the ends' shared ones
        assert after <= before - 3 * MB
        assert m[MB + 200] == 200 % 256 and m[3 * MB + 5] == 5
        elsewhere = torch.arange(1024, dtype=torch.int64)
        assert release_file_range(maps, elsewhere.data_ptr(), 8192) == 0
        assert int(elsewhere[1000]) == 1000
