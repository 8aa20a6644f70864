"""fast.core.files: every file the project writes is written atomically (Child et al., 2019, sec. 6:
long runs must survive being killed, and so must the caches the figures are drawn from)."""

from __future__ import annotations

import json

import pytest

from fast.core.files import atomic_write, write_json


def test_write_json_round_trips(tmp_path):
    path = tmp_path / "sub" / "data.json"
    write_json(path, {"a": [1, 2.5]})
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}


def test_failed_write_keeps_the_old_file_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "data.json"
    write_json(path, {"old": True})

    def broken(f):
        f.write(b'{"new": tr')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]
