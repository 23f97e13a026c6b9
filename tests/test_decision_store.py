"""decision_cache.shared_store, the seam onnxfuse on Ray uses: inside it, decision caches read from and merge
into the store given, and never touch the cache file."""

from __future__ import annotations

import os

from onnxfuse.select.decision_cache import DecisionCache, shared_store


class DictStore:
    def __init__(self, entries):
        self.entries = dict(entries)
        self.merged: list[dict] = []

    def read(self):
        return self.entries

    def merge(self, new):
        self.merged.append(dict(new))
        self.entries.update(new)


def test_a_shared_store_replaces_the_file(tmp_path):
    on_disk = DecisionCache(directory=str(tmp_path))
    on_disk.put("from-file", {"kind": "region", "ratio": [0.9, 0.8, 1.0]})
    on_disk.save()
    before = open(on_disk.path).read()
    store = DictStore({"shared": {"kind": "region", "ratio": [1.1, 1.0, 1.2]}})
    with shared_store(store):
        cache = DecisionCache(directory=str(tmp_path))
        assert cache.get("shared") == {"kind": "region", "ratio": [1.1, 1.0, 1.2]}
        assert cache.get("from-file") is None  # the file is not read
        cache.put("new", {"kind": "region", "ratio": [0.9, 0.8, 1.0]})
        cache.save()
        assert cache.get("new")["ratio"] == [0.9, 0.8, 1.0]
    assert [list(m) for m in store.merged] == [["new"]]
    assert open(on_disk.path).read() == before  # nor written
    after = DecisionCache(directory=str(tmp_path))  # outside the block: the file again
    assert after.get("from-file") is not None and after.get("new") is None
    assert sorted(after.decisions()) == ["from-file"]
    assert os.listdir(tmp_path) == ["decisions.json"]
