"""The coordinator's methods are declared once, in rhino/coordinator/api.py, and held to it:

- the coordinator serves exactly those: each is a public method of ``Coordinator``, and it
  has no other public method but its lifetime's; an unknown name is refused;
- both clients have exactly those methods, each taking the server's arguments (the same
  names and defaults) and returning what the table says its answer is parsed into;
- docs/protocol.md §8.2 lists exactly those, in the table's order.

So none of the three can gain or lose a method alone.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from rhino.coordinator.api import METHODS
from rhino.coordinator.client import CoordinatorClient, LocalCoordinatorClient, _Methods
from rhino.coordinator.coordinator import Coordinator
from rhino.errors import BusyError, InvalidArgumentError

PROTOCOL = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

# what a Coordinator has besides the methods it serves: its lifetime, its log, the dispatch
NOT_SERVED = {"close", "log", "handle"}


def public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}


def documented_methods(text: str) -> list[str]:
    """The first column of the table of docs/protocol.md §8.2, in order."""
    m = re.search(r"^### 8\.2 Methods\n(.*?)(?=^#{1,3} |\Z)", text, re.M | re.S)
    assert m, "docs/protocol.md has no section '### 8.2 Methods'"
    return re.findall(r"^\| `([a-z_]+)` \|", m.group(1), re.M)


def test_the_protocol_document_lists_exactly_the_declared_methods() -> None:
    listed = documented_methods(PROTOCOL.read_text(encoding="utf-8"))
    assert len(listed) == len(set(listed)), f"docs/protocol.md §8.2 lists a method twice: {listed}"
    missing, extra = sorted(set(METHODS) - set(listed)), sorted(set(listed) - set(METHODS))
    assert not missing and not extra, (f"docs/protocol.md §8.2 lacks {missing} and lists {extra}, which "
                                       "rhino/coordinator/api.py does not declare")
    assert listed == list(METHODS), "docs/protocol.md §8.2 lists the methods in another order than api.py"


def test_the_coordinator_serves_exactly_the_declared_methods() -> None:
    served = public_methods(Coordinator) - NOT_SERVED
    missing, extra = sorted(set(METHODS) - served), sorted(served - set(METHODS))
    assert not missing, f"api.py declares {missing}, which Coordinator has no public method for"
    assert not extra, (f"Coordinator has public methods {extra} that api.py does not declare: declare them "
                       "(and list them in docs/protocol.md §8.2), make them private, or add them to NOT_SERVED")


def test_the_coordinator_refuses_what_is_not_declared_and_serves_some_while_rebuilding(tmp_path: Path) -> None:
    with Coordinator(str(tmp_path / "coord"), secret=b"s" * 32, rebuilding=True) as coord:
        with pytest.raises(InvalidArgumentError, match="unknown coordinator method 'launch_missiles'"):
            coord.handle("launch_missiles", {})
        with pytest.raises(InvalidArgumentError, match="unknown coordinator method 'close'"):
            coord.handle("close", {})
        assert coord.handle("status", {})["operators"] == []
        with pytest.raises(BusyError, match="rebuilding"):
            coord.handle("placement", {"operator_id": "op"})
    assert sorted(n for n, m in METHODS.items() if m.while_rebuilding) == ["heartbeat", "register", "status"]


def test_the_clients_have_exactly_the_declared_methods() -> None:
    have = public_methods(_Methods) - {"call"}
    assert have == set(METHODS), (f"the clients lack {sorted(set(METHODS) - have)} and have "
                                  f"{sorted(have - set(METHODS))}, which api.py does not declare")
    for client in (CoordinatorClient, LocalCoordinatorClient):
        assert issubclass(client, _Methods)
        assert not public_methods(client) & set(METHODS), f"{client.__name__} overrides a declared method"


@pytest.mark.parametrize("name", list(METHODS))
def test_each_client_method_takes_the_servers_arguments_and_returns_the_declared_answer(name: str) -> None:
    client = inspect.signature(getattr(_Methods, name)).parameters
    server = inspect.signature(getattr(Coordinator, name)).parameters
    named = {n: p for n, p in client.items() if n != "self" and p.kind is not p.VAR_KEYWORD}
    passes_on = any(p.kind is p.VAR_KEYWORD for p in client.values())  # the rest, as keywords
    for n, p in named.items():
        assert n in server, f"the client's {name}() takes {n!r}, which the coordinator's does not"
        if server[n].default is not p.empty:
            assert p.default == server[n].default, f"{name}({n}=...): the client's default is not the server's"
    required = [n for n, p in server.items() if n != "self" and p.default is p.empty]
    assert passes_on or set(required) <= set(named), f"the client's {name}() cannot pass {required}"
    answer = typing.get_type_hints(getattr(_Methods, name))["return"]
    assert answer is (METHODS[name].answer or dict), f"{name}() returns {answer}, api.py says its answer is " \
                                                     f"{METHODS[name].answer}"
