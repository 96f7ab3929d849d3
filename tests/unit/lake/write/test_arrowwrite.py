"""Pure parts of the Arrow writer: partition directories, hash keys, Delta stats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import ConfigError
from pipeline.lake.archivewrite import _arrow_writer
from pipeline.lake.write.arrowtask import _hash_keys
from pipeline.lake.write.filerows import ENTRIES_FILE
from pipeline.lake.write.parquetfile import ROW_GROUP_ROWS, partition_dir
from pipeline.lake.write.parquetfile import PartFile as _File
from pipeline.settings import LakeSettings


def test_partition_dir_escapes_like_spark() -> None:
    assert partition_dir("chain:demo") == "stream=chain%3Ademo"
    assert partition_dir("a=b/c d%") == "stream=a%3Db%2Fc d%25"
    assert partition_dir("plain") == "stream=plain"


def test_hash_keys_are_the_first_eight_bytes() -> None:
    hashes = pa.array(["ff" * 32, "0123456789abcdef" + "0" * 48, "00" * 32])
    keys = _hash_keys(hashes)
    assert keys.dtype == np.uint64
    assert keys.tolist() == [2**64 - 1, 0x0123456789ABCDEF, 0]
    assert _hash_keys(hashes.slice(1)).tolist() == [0x0123456789ABCDEF, 0]
    assert _hash_keys(hashes.slice(0, 0)).tolist() == []


def _rows(start: int, n: int, with_num: bool) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "entry_id": f"{start + i}-0",
                "entry_ms": start + i,
                "entry_seq": 0,
                "fields": [],
                "block_num": i if with_num else None,
            }
            for i in range(n)
        ],
        schema=ENTRIES_FILE,
    )


def test_file_writes_row_groups_and_delta_stats(tmp_path: Path) -> None:
    stats = ["entry_ms", "entry_seq", "block_num"]
    out = _File(str(tmp_path / "stream=x"), 3, ENTRIES_FILE, stats)
    out.add(_rows(10, ROW_GROUP_ROWS, with_num=False))
    out.add(_rows(5, 7, with_num=True))
    out.close()
    assert out.name.startswith("part-00003-") and out.name.endswith(".c000.snappy.parquet")
    written = pq.ParquetFile(out.path)
    assert written.metadata.num_rows == ROW_GROUP_ROWS + 7
    assert written.metadata.num_row_groups == 2
    assert written.schema_arrow.names == ENTRIES_FILE.names
    doc = json.loads(out.delta_stats())
    assert doc == {
        "numRecords": ROW_GROUP_ROWS + 7,
        "minValues": {"entry_ms": 5, "entry_seq": 0, "block_num": 0},
        "maxValues": {"entry_ms": ROW_GROUP_ROWS + 9, "entry_seq": 0, "block_num": 6},
        "nullCount": {"entry_ms": 0, "entry_seq": 0, "block_num": ROW_GROUP_ROWS},
    }
    report = out.report("entries")
    assert report["entries_path"] == out.name and report["entries_size"] > 0
    empty = _File(str(tmp_path / "stream=x"), 4, ENTRIES_FILE, stats)
    empty.close()
    assert empty.report("blocks") == {
        "blocks_path": None,
        "blocks_size": None,
        "blocks_stats": None,
    }
    assert not Path(empty.path).exists()


def test_a_bad_writer_setting_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SLUICE_ARCHIVE_WRITER"):
        _arrow_writer(LakeSettings(uri=str(tmp_path), archive_writer="fast"))
    with pytest.raises(ConfigError, match="object storage"):  # Spark does not write to S3
        _arrow_writer(LakeSettings(uri="s3://bucket/lake", archive_writer="spark"))
