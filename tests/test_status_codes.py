"""The status codes are one list, ``RHINO_STATUS_CODES`` in src/cpp/include/rhino/status_codes.h
(issue 44), which the extension hands out as ``rhino._core.status_codes()``. What C++ cannot
generate from it is checked against it here:

- every code has its class in rhino/errors.py: a RhinoError subclass, in ``__all__``, and
  re-exported as ``rhino.<class>``;
- every RhinoError subclass of rhino/errors.py is some code's class (``PYTHON_ONLY`` below lists
  the deliberate exceptions, with why), and ``__all__`` holds nothing else;
- the status-code table of docs/protocol.md §3 lists the same numbers and names, and the
  independent wire oracle tests/dataplane_wire.py uses the same numbers;
- each code crosses the coordinator transport (§8) both ways as its own class: a handler raising
  the class, or answering the number, makes the client raise that class with the message.
"""

from __future__ import annotations

import inspect
import json
import re
from contextlib import closing
from pathlib import Path

import pytest

import dataplane_wire
import rhino
from rhino import _core, errors
from rhino_testing.harness.workers import SECRET

REPO = Path(__file__).resolve().parent.parent
CODES = _core.status_codes()  # [(number, name, python_class)], OK excluded

# RhinoError subclasses of rhino/errors.py that no status code raises, by name, each with the reason.
# None today: everything that module defines, a C++ peer can report as well. (Errors only a Python
# layer raises live in that layer, e.g. rhino.spark.errors.InputLostError.)
PYTHON_ONLY: dict[str, str] = {}


def _ids(rows) -> list[str]:
    return [name for _, name, _ in rows]


def _rhino_error_classes() -> dict[str, type]:
    """The RhinoError subclasses rhino/errors.py defines (not ones it imports), by name."""
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.RhinoError) and obj.__module__ == errors.__name__
    }


def test_the_list_has_one_row_per_number_name_and_class() -> None:
    numbers, names, classes = zip(*CODES)
    for column in (numbers, names, classes):
        assert len(set(column)) == len(column), column
    assert 0 not in numbers and "OK" not in names  # OK carries no message and raises nothing
    assert all(re.fullmatch(r"[A-Z][A-Za-z]*", n) for n in names), names


@pytest.mark.parametrize("number,name,python_class", CODES, ids=_ids(CODES))
def test_every_code_has_its_class_in_rhino_errors(number: int, name: str, python_class: str) -> None:
    cls = _rhino_error_classes().get(python_class)
    assert cls is not None, f"code {number} ({name}) raises {python_class}, which rhino/errors.py does not define"
    assert cls is not errors.RhinoError and issubclass(cls, errors.RhinoError)
    assert python_class in errors.__all__, f"{python_class} is missing from rhino.errors.__all__"
    assert python_class in rhino.__all__ and getattr(rhino, python_class) is cls, f"rhino.{python_class}"


def test_every_class_in_rhino_errors_is_a_code() -> None:
    defined = _rhino_error_classes()
    raised = {python_class for _, _, python_class in CODES}
    for name, reason in PYTHON_ONLY.items():
        assert name in defined and name not in raised and reason, name
    unmapped = set(defined) - raised - {"RhinoError"} - set(PYTHON_ONLY)
    assert not unmapped, f"classes of rhino/errors.py no status code raises: {sorted(unmapped)}"
    assert set(errors.__all__) == set(defined), "rhino.errors.__all__ is exactly the classes it defines"
    assert len(errors.__all__) == len(set(errors.__all__))


def _protocol_status_table() -> dict[int, str]:
    """docs/protocol.md §3's table of status codes: {number: name}."""
    text = (REPO / "docs" / "protocol.md").read_text()
    section = text[text.index("\n## 3. "):text.index("\n## 4. ")]

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    lines = iter(section.splitlines())
    for line in lines:
        if line.startswith("|") and cells(line) == ["code", "name", "meaning"]:
            break
    else:
        pytest.fail("docs/protocol.md §3 has no `| code | name | meaning |` table")
    next(lines)  # |---|---|---|
    table: dict[int, str] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        number, name, meaning = cells(line)
        assert int(number) not in table and meaning, line
        table[int(number)] = name
    return table


def test_protocol_md_lists_the_same_codes() -> None:
    assert _protocol_status_table() == {0: "OK"} | {number: name for number, name, _ in CODES}


def test_the_wire_oracle_uses_the_same_numbers() -> None:
    # tests/dataplane_wire.py names the codes it sends in upper snake case (NOT_FOUND = 1)
    named = 0
    for number, name, _ in CODES:
        constant = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).upper()
        if hasattr(dataplane_wire, constant):
            assert getattr(dataplane_wire, constant) == number, constant
            named += 1
    assert dataplane_wire.OK == 0 and named > 0


def _handler(method: str, args: str):
    """raise: raises args["class"](args["msg"]); answer: answers code args["code"] with args["msg"]."""
    a = json.loads(args)
    if method == "raise":
        raise getattr(errors, a["class"])(a["msg"])
    return a["code"], a["msg"], ""


@pytest.fixture(scope="module")
def client():
    server = _core.CoordServer("127.0.0.1", 0, SECRET, _handler, threads=1)
    try:
        with closing(_core.StateClient.connect(server.address, SECRET)) as c:
            yield c
    finally:
        server.close()


@pytest.mark.parametrize("number,name,python_class", CODES, ids=_ids(CODES))
def test_every_code_crosses_the_wire_as_its_class(client, number: int, name: str, python_class: str) -> None:
    cls = getattr(errors, python_class)
    msg = f"{name} across the wire"
    for method, args in [("raise", {"class": python_class}), ("answer", {"code": number})]:
        with pytest.raises(errors.RhinoError) as e:
            client.coord(method, json.dumps(args | {"msg": msg}))
        assert type(e.value) is cls and str(e.value) == msg, (method, e.value)
