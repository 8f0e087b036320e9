"""docs/files.md, the map of which file holds which concept, names only files that exist, and
every folder of the C++ core and of the Python packages appears in it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAP = REPO / "docs" / "files.md"


def _named_paths() -> list[str]:
    # the backticked names in the tables' second column that look like paths
    out = []
    for line in MAP.read_text().splitlines():
        if not line.startswith("|"):
            continue
        for tok in re.findall(r"`([^`\s]+)`", line):
            if "/" in tok and not tok.startswith(("rhino.", "-", "/")):
                out.append(tok)
    return out


def test_every_named_path_exists():
    names = _named_paths()
    assert len(names) > 60, names  # the tables were read at all
    missing = [n for n in names if not (REPO / n).exists() and not (REPO / "src" / "cpp" / n).exists()]
    assert not missing, f"docs/files.md names paths that do not exist: {missing}"


def test_every_code_folder_is_on_the_map():
    text = MAP.read_text()
    folders = [p.name + "/" for p in (REPO / "src" / "cpp").iterdir() if p.is_dir() and p.name != "include"]
    folders += [f"rhino/{p.name}/" for p in (REPO / "rhino").iterdir() if (p / "__init__.py").exists()]
    folders += [f"spark_integration/spark/{p.name}/" for p in (REPO / "spark_integration" / "spark").iterdir()
                if (p / "__init__.py").exists()]
    absent = [f for f in folders if f"`{f}" not in text and f" {f}" not in text and f"`{f.rstrip('/')}" not in text]
    assert not absent, f"folders missing from docs/files.md: {absent}"
