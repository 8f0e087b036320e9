"""The include layering of the C++ (docs/design.md §2, "Include layering (C++)"), checked.

The rules are read from that section of docs/design.md, so the doc and the check cannot drift: one
bullet per folder, "- `folder/` (what it is): `dep/`, `dep/` (why), ...", where "nothing else" lists
none, "any of the above" every folder of the bullets before it, and text after a ';' is commentary.
Every ``#include "..."`` of ``src/cpp/**``, ``bindings/`` and ``fuzz/`` (``*.h``, ``*.cc``) is
resolved the way the compiler does (the including file's folder, then ``src/cpp/include``, then
``src/cpp``) and must name a file of:
- the including file's own folder;
- the public headers (``src/cpp/include/rhino/``), from any folder; a public header itself may
  include only the other public headers (the doc's "which include only one another");
- a folder its bullet lists. A unit test (``*_test.cc``, its own bullet) may include what its
  folder may, and ``testing/``. ``testing/`` (the tests' shared helpers) has its own bullet; no other
  code lists it, so library code never includes a test helper.
An include that resolves to no file of the repository fails too. The checker itself is tested on a
sample section and a small tree, so it is known to fail when the code breaks the layering.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SECTION = "### Include layering (C++)"
PUBLIC = "include/rhino"  # src/cpp/include/rhino: the public headers
TESTS = "*_test.cc"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


@dataclass
class Rules:
    """What each folder (as the doc names it, without the slash) may include besides itself."""

    allowed: dict[str, set[str]] = field(default_factory=dict)
    test_extra: set[str] = field(default_factory=set)  # what a *_test.cc adds to its folder's


def section_text(design: str) -> str:
    start = design.index(SECTION)  # ValueError: the section was renamed or removed
    rest = design[start + len(SECTION):]
    end = re.search(r"^#{1,3} ", rest, re.M)
    return rest[: end.start()] if end else rest


def _strip_parentheses(text: str) -> str:
    while True:
        stripped = re.sub(r"\([^()]*\)", "", text)
        if stripped == text:
            return text
        text = stripped


def _folders(text: str) -> list[str]:
    return [m.rstrip("/") for m in re.findall(r"`([^`]+/)`", text)]


def parse_rules(design: str) -> Rules:
    section = section_text(design)
    intro = " ".join(section.split("\n- ")[0].split())
    # The two rules of the introduction that every folder shares.
    assert "the public headers (`include/rhino/`, which include only one another)" in intro, intro
    assert "may include its own headers" in intro, intro
    rules = Rules()
    above: list[str] = []
    for line in re.findall(r"^- (.+)$", section, re.M):
        head, sep, deps = _strip_parentheses(line).partition(":")
        assert sep, f"a layering bullet without 'folder: what it may include': {line!r}"
        deps = deps.split(";")[0]
        subjects = re.findall(r"`([^`]+)`", head)
        assert subjects, f"a layering bullet that names no folder: {line!r}"
        if "any of the above" in deps:
            allowed = set(above)
        elif "nothing else" in deps:
            allowed = set()
        else:
            allowed = set(_folders(deps))
        if subjects == [TESTS]:
            assert "what its folder may" in deps, line
            rules.test_extra = allowed
            continue
        for s in subjects:
            assert s.endswith("/"), f"{s!r} in {line!r} is not a folder (`name/`)"
            rules.allowed[s.rstrip("/")] = allowed
            above.append(s.rstrip("/"))
    return rules


def folder_of(rel: str) -> str:
    """The folder a repository path belongs to, as the rules name it."""
    parts = rel.split("/")
    if parts[:2] == ["src", "cpp"]:
        return PUBLIC if parts[2:4] == ["include", "rhino"] else parts[2]
    return parts[0]


def resolve(root: Path, including: Path, target: str) -> Path | None:
    for base in (including.parent, root / "src/cpp/include", root / "src/cpp"):
        if (base / target).is_file():
            return (base / target).resolve()
    return None


def sources(root: Path) -> list[Path]:
    found = []
    for top in ("src/cpp", "bindings", "fuzz"):
        for suffix in ("*.h", "*.cc"):
            found += (root / top).rglob(suffix)
    return sorted(found)


def violations(root: Path, rules: Rules) -> list[str]:
    root = root.resolve()
    out = []
    for path in sources(root):
        rel = path.relative_to(root).as_posix()
        mine = folder_of(rel)
        if mine == PUBLIC:
            allowed = {PUBLIC}
        elif mine not in rules.allowed:
            out.append(f"{rel}: folder {mine}/ has no rule in docs/design.md ({SECTION})")
            continue
        else:
            allowed = {mine, PUBLIC} | rules.allowed[mine]
            if path.name.endswith(TESTS[1:]):
                allowed |= rules.test_extra
        text = path.read_text()
        for m in INCLUDE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(root, path, m.group(1))
            if target is None:
                out.append(f'{rel}:{line}: #include "{m.group(1)}" names no file of the repository')
                continue
            theirs = folder_of(target.relative_to(root).as_posix())
            if theirs not in allowed:
                what = "a public header includes only public headers" if mine == PUBLIC else \
                    f"{mine}/ may include {', '.join(sorted(a + '/' for a in allowed))}"
                out.append(f'{rel}:{line}: #include "{m.group(1)}" reaches into {theirs}/ ({what})')
    return out


# ---- the repository ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rules() -> Rules:
    return parse_rules((REPO / "docs/design.md").read_text())


def test_every_include_keeps_the_layering_of_design_md(rules):
    found = violations(REPO, rules)
    assert not found, "includes that break docs/design.md's layering:\n  " + "\n  ".join(found)


def test_every_folder_has_a_rule(rules):
    folders = {p.name for p in (REPO / "src/cpp").iterdir() if p.is_dir() and p.name != "include"}
    assert folders | {"bindings", "fuzz"} <= set(rules.allowed), sorted(folders - set(rules.allowed))
    assert rules.test_extra == {"testing"}
    for folder, allowed in rules.allowed.items():
        assert "testing" not in allowed or folder == "testing", f"{folder}/ may include the test helpers"
        assert folder in {"bindings", "fuzz"} or not allowed & {"bindings", "fuzz"}, folder


# ---- the checker on samples -------------------------------------------------------------------

SAMPLE = textwrap.dedent("""\
    ## 2. Design

    ### Include layering (C++)

    A folder may include its own headers, the public headers (`include/rhino/`, which include
    only one another), and the private headers of the folders it lists below.

    - `util/`: nothing else.
    - `net/` (the wire: frames, connections): `util/`.
    - `state/`, `store/`: `util/`, `net/` (its frames; see §3: not `service/`).
    - `service/`: any of the above.
    - `testing/`: any of the above.
    - `*_test.cc` (a unit test): what its folder may, and `testing/`.
    - `bindings/`: the public headers and `state/`; `fuzz/` checks the rest.

    ## 3. Next
    - `other/`: `util/`.
    """)


def test_rules_are_parsed_from_the_section():
    r = parse_rules(SAMPLE)
    assert r.allowed == {
        "util": set(),
        "net": {"util"},
        "state": {"util", "net"},  # the parenthesis's `service/` is commentary
        "store": {"util", "net"},
        "service": {"util", "net", "state", "store"},
        "testing": {"util", "net", "state", "store", "service"},
        "bindings": {"state"},  # after the ';': commentary, `fuzz/` is no rule
    }
    assert r.test_extra == {"testing"}


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_each_bad_include_is_named(tmp_path):
    _tree(tmp_path, {
        "src/cpp/include/rhino/status.h": "#pragma once\n",
        "src/cpp/include/rhino/api.h": '#include "rhino/status.h"\n#include "util/fs.h"\n',
        "src/cpp/util/fs.h": '#include "rhino/status.h"\n',
        "src/cpp/util/fs.cc": '#include "util/fs.h"\n#include <vector>\n#include "net/frame.h"\n',
        "src/cpp/util/fs_test.cc": '#include "util/fs.h"\n#include "testing/test_util.h"\n',
        "src/cpp/net/frame.h": '#include "fs.h"\n',  # not in net/, include/ or src/cpp/
        "src/cpp/net/frame.cc": '#include "net/frame.h"\n#include "util/fs.h"\n#include "testing/test_util.h"\n',
        "src/cpp/state/open.h": "",
        "src/cpp/state/state.cc": '#include "open.h"\n#include "service/session.h"\n',
        "src/cpp/service/session.h": '#include "state/open.h"\n#include "net/frame.h"\n',
        "src/cpp/testing/test_util.h": '#include "service/session.h"\n',
        "src/cpp/extra/x.cc": "",
        "bindings/errors.h": "",
        "bindings/module.cc": '#include "errors.h"\n#include "rhino/api.h"\n#include "state/open.h"\n'
                              '#include "net/frame.h"\n',
        "fuzz/fuzzer.cc": '#include "net/frame.h"\n',
    })
    found = violations(tmp_path, parse_rules(SAMPLE))
    assert found == [
        "bindings/module.cc:4: #include \"net/frame.h\" reaches into net/ (bindings/ may include bindings/, "
        "include/rhino/, state/)",
        "fuzz/fuzzer.cc: folder fuzz/ has no rule in docs/design.md (### Include layering (C++))",
        "src/cpp/extra/x.cc: folder extra/ has no rule in docs/design.md (### Include layering (C++))",
        "src/cpp/include/rhino/api.h:2: #include \"util/fs.h\" reaches into util/ (a public header includes "
        "only public headers)",
        "src/cpp/net/frame.cc:3: #include \"testing/test_util.h\" reaches into testing/ (net/ may include "
        "include/rhino/, net/, util/)",
        'src/cpp/net/frame.h:1: #include "fs.h" names no file of the repository',
        "src/cpp/state/state.cc:2: #include \"service/session.h\" reaches into service/ (state/ may include "
        "include/rhino/, net/, state/, util/)",
        "src/cpp/util/fs.cc:3: #include \"net/frame.h\" reaches into net/ (util/ may include include/rhino/, "
        "util/)",
    ]
