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


def test_only_cpython_before_3_13_is_patched():
    assert zip_imports.needed("cpython", (3, 11)) and zip_imports.needed("cpython", (3, 12))
    assert not zip_imports.needed("cpython", (3, 13))  # re-reads only what changed itself
    assert not zip_imports.needed("pypy", (3, 10))


def test_a_zipimport_without_the_method_leaves_cpythons_own_path(monkeypatch):
    monkeypatch.delattr(zipimport.zipimporter, "invalidate_caches")
    assert zip_imports.install() is False  # no AttributeError at every task's start
    importlib.invalidate_caches()  # what pyspark's worker does next still works


def test_an_importer_that_is_not_as_expected_gets_cpythons_invalidation(tmp_path, monkeypatch):
    archive = tmp_path / "lib.zip"
    _write(archive, {"zipmod_c": "Z = 3\n"})
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        zipimport.zipimporter.invalidate_caches)  # restored after the test
    calls = []
    real = zipimport.zipimporter.invalidate_caches
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        lambda self: calls.append(self) or real(self))
    assert zip_imports.install()
    finder = zipimport.zipimporter(str(archive))
    monkeypatch.setattr(zip_imports, "_stamp", lambda archive: 1 / 0)  # a stat that fails
    finder.invalidate_caches()
    assert calls == [finder]
