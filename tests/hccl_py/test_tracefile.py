"""``hccl_py.tracefile``: the ranks' Chrome trace files and their merge (what hccl-launch --trace
leaves behind)."""

from __future__ import annotations

import json

from hccl_py import tracefile


def test_ranks_files_merge_in_rank_order_and_a_torn_file_is_skipped(tmp_path):
    for rank in (1, 0):
        tracefile.write(tmp_path / tracefile.rank_file(rank), [{"ph": "X", "pid": rank, "name": "all_reduce #0"}])
    (tmp_path / tracefile.rank_file(2)).write_text('{"traceEvents": [{"ph"')  # a rank killed mid-write
    merged = tracefile.merge(tmp_path)
    assert merged == tmp_path / "trace.json"
    doc = json.loads(merged.read_text())
    assert doc == tracefile.document(
        [{"ph": "X", "pid": 0, "name": "all_reduce #0"}, {"ph": "X", "pid": 1, "name": "all_reduce #0"}]
    )
    assert doc["displayTimeUnit"] == "ms"


def test_nothing_to_merge(tmp_path):
    assert tracefile.merge(tmp_path) is None
    assert not (tmp_path / "trace.json").exists()


def test_write_creates_folders(tmp_path):
    path = tracefile.write(tmp_path / "a" / "b" / tracefile.rank_file(7), [])
    assert path.name == "rank_7.trace.json"
    assert json.loads(path.read_text()) == {"traceEvents": [], "displayTimeUnit": "ms"}


def test_a_trace_folder_that_cannot_be_written_is_refused_at_init_not_at_exit(tmp_path, monkeypatch):
    import pytest

    import hccl_py

    blocker = tmp_path / "file"
    blocker.write_text("")  # a folder cannot be made under a file
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HCCL_PY_TRACE_DIR", str(blocker / "trace"))
    with pytest.raises(hccl_py.HcclParamError) as info:
        hccl_py.init()
    assert info.value.variable == "HCCL_PY_TRACE_DIR" and info.value.rule == "writable"
    assert hccl_py.runtime.current() is None  # it never joined
