"""executor/zip_imports: a zipimporter re-reads its archive only when it changed."""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
import zipimport

from pipeline.executor import zip_imports


def _write(path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, body in modules.items():
            z.writestr(f"{name}.py", body)


def test_an_unchanged_archive_is_not_read_again_a_changed_one_is(tmp_path, monkeypatch):
    archive = tmp_path / "lib.zip"
    _write(archive, {"zipmod_a": "X = 1\n"})
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        zipimport.zipimporter.invalidate_caches)  # restored after the test
    monkeypatch.syspath_prepend(str(archive))
    importlib.import_module("zipmod_a")
    monkeypatch.delitem(sys.modules, "zipmod_a")
    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda a: reads.append(a) or real(a))

    zip_imports.install()
    zip_imports.install()  # idempotent
    importlib.invalidate_caches()
    assert reads == []  # what pyspark's worker does before each task: no re-read

    _write(archive, {"zipmod_a": "X = 1\n", "zipmod_b": "Y = 2\n"})
    st = os.stat(archive)
    os.utime(archive, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    importlib.invalidate_caches()
    assert reads == [str(archive)]  # changed on disk: read again, its new module imports
    assert importlib.import_module("zipmod_b").Y == 2
    monkeypatch.delitem(sys.modules, "zipmod_b")
