"""A record format is one folder of pipeline/formats/ plus one registration in
registry.FORMATS (docs/architecture.md, "Where to add things"): every format folder is
registered, and every registered format lives in a format folder named by its name."""

from __future__ import annotations

from pathlib import Path

from pipeline.formats.registry import FORMATS

FORMATS_DIR = Path(__file__).resolve().parents[2] / "pipeline" / "formats"
# Folders of formats/ that are not a record format: the COPY encodings every format's rows
# are written in.
NOT_FORMATS = {"wire"}


def format_folders() -> set[str]:
    return {p.name for p in FORMATS_DIR.iterdir()
            if (p / "__init__.py").is_file()} - NOT_FORMATS


def folder_of(cls: type) -> str | None:
    """The formats/ folder a format class is defined in (pipeline.formats.<folder>.<module>),
    None for a class defined anywhere else."""
    parts = cls.__module__.split(".")
    return parts[2] if len(parts) == 4 and parts[:2] == ["pipeline", "formats"] else None


def test_every_registered_format_lives_in_the_format_folder_its_name_names():
    folders = format_folders()
    misplaced = {name: cls.__module__ for name, cls in FORMATS.items()
                 if folder_of(cls) not in folders or name.split("_")[0] != folder_of(cls)}
    assert misplaced == {}, (f"registered formats outside their folder of pipeline/formats/ "
                             f"({sorted(folders)}): {misplaced}")


def test_every_format_folder_is_registered():
    registered = {folder_of(cls) for cls in FORMATS.values()}
    assert format_folders() - registered == set(), (
        "a folder of pipeline/formats/ that no registry.FORMATS entry uses: register its "
        "format, or add the folder to NOT_FORMATS if it is not one")
