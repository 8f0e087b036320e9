"""The house's length limit (issue 26): no function of the library's Python over 100 lines, no C++
function over 120, as counted by tools/function_lengths.py (``ast`` for Python, a brace count for
C++). The counters themselves are checked on small samples whose lengths are known."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "function_lengths.py"


@pytest.fixture(scope="module")
def fl():
    spec = importlib.util.spec_from_file_location("function_lengths", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["function_lengths"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("function_lengths", None)


def test_no_library_function_exceeds_its_limit():
    p = subprocess.run([sys.executable, str(TOOL), "--max-py", "100", "--max-cpp", "120"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


CPP_SAMPLE = r'''#include "rhino/status.h"
#define BRACE_MACRO(x) { x; }

namespace rhino {
namespace {

const int kTable[] = {1, 2, 3};
auto kSquare = [](int x) { return x * x; };  // an initializer, not a function

enum class Color : int { kRed, kGreen };

// A comment with a brace { that must not count.
int Helper(int a,
           int b) {
  auto add = [&](int c) {
    if (c > 0) {
      return a + c;
    }
    return b;
  };
  const char* s = "a string with } and {{ braces";
  const char* raw = R"json({"a": {"b": 1}})json";
  char open = '{';
  /* } */
  return add(1) + s[0] + raw[0] + open;
}

}  // namespace

class Widget : public Base {
 public:
  Widget(int n) : n_{n}, name_("w") {
    Init();
  }
  int size() const { return n_; }
  bool operator==(const Widget& o) const {
    return n_ == o.n_;
  }

 private:
  struct Inner {
    void Run() {
      n = 1;
    }
    int n{0};
  };
  int n_{0};
  std::string name_;
};

template <typename T>
T Widget2<T>::Get() const
{
  return T{};
}

Status Widget::Load(const std::string& path) {
  std::vector<int> v = {1, 2};
  for (int x : v) {
    switch (x) {
      case 1: {
        break;
      }
    }
  }
  return Status::OK();
}

}  // namespace rhino
'''


def test_cpp_counter_counts_a_sample(fl):
    found = [(f.name, f.line, f.length) for f in fl.cpp_functions_in_text(CPP_SAMPLE, "sample.cc")]
    assert found == [
        ("Helper", 13, 14),  # its two signature lines; the lambda and the braces in literals are no blocks
        ("Widget::Widget", 32, 3),  # a constructor whose member initializer has braces
        ("Widget::size", 35, 1),
        ("Widget::operator==", 36, 3),
        ("Widget::Inner::Run", 42, 3),
        ("Widget2<T>::Get", 51, 5),  # from its template line, brace on a line of its own
        ("Widget::Load", 57, 11),
    ]


def test_cpp_blanking_keeps_lines_and_drops_braces_in_literals(fl):
    text = 'a = "{"; // }\nb = \'}\'; /* {\n } */ c = R"x({)x";\n#define X {\n'
    blanked = fl.blank_cpp(text)
    assert blanked.count("\n") == text.count("\n")
    assert "{" not in blanked and "}" not in blanked


def test_python_counter_measures_nested_functions(fl, tmp_path):
    source = tmp_path / "pkg" / "mod.py"
    source.parent.mkdir()
    source.write_text(textwrap.dedent('''\
        import functools


        @functools.cache
        def outer(x):
            def inner(y):
                return y

            return inner(x)


        class Box:
            async def run(self,
                          n):
                return n
        '''))
    found = [(f.name, f.line, f.length) for f in fl.python_functions(source, "pkg.mod", tmp_path)]
    assert found == [("pkg.mod:outer", 5, 5), ("pkg.mod:outer.<locals>.inner", 6, 2), ("pkg.mod:Box.run", 13, 3)]


def _write_repo(root: Path, body_lines: int) -> None:
    (root / "pyproject.toml").write_text(textwrap.dedent('''\
        [tool.scikit-build]
        wheel.exclude = ["lib/skipped/**"]

        [tool.scikit-build.wheel.packages]
        "lib" = "src/lib"
        "lib/plug" = "plugin/plug"
        '''))
    long_body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    for rel in ("src/lib/__init__.py", "src/lib/core.py", "src/lib/skipped/big.py", "plugin/plug/run.py"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"def f():\n{long_body}")


def test_scope_is_the_wheel_as_pyproject_maps_it(fl, tmp_path):
    _write_repo(tmp_path, 3)
    modules = [(p.relative_to(tmp_path).as_posix(), m) for p, m in fl.wheel_modules(tmp_path)]
    assert modules == [("plugin/plug/run.py", "lib.plug.run"), ("src/lib/__init__.py", "lib"),
                       ("src/lib/core.py", "lib.core")]


def test_exits_1_and_lists_what_exceeds(fl, tmp_path, capsys):
    _write_repo(tmp_path, 6)  # functions of 7 lines
    assert fl.main(["--repo", str(tmp_path), "--lang", "py", "--max-py", "7"]) == 0
    assert fl.main(["--repo", str(tmp_path), "--lang", "py", "--max-py", "6", "--top", "1"]) == 1
    out, err = capsys.readouterr()
    assert "3 function(s) exceed the limit" in err
    assert "lib.plug.run:f  (plugin/plug/run.py:1)" in err and "lib.core:f" in err
    assert "lib.skipped" not in out + err


def test_the_development_packages_are_measured_and_their_list_of_debts_is_current(fl):
    """bench/ and testing/ are measured too; DEV_OVER_LIMIT names only functions that exist and
    still exceed the limit (an entry that fits is removed, so it cannot grow back unnoticed)."""
    functions = {f.name: f for path, mod in fl.dev_modules() for f in fl.python_functions(path, mod)}
    assert any(n.startswith("rhino_bench.") for n in functions) and any(n.startswith("rhino_testing.")
                                                                         for n in functions)
    stale = [n for n in fl.DEV_OVER_LIMIT if n not in functions or functions[n].length <= 100]
    assert not stale, f"remove from DEV_OVER_LIMIT: {stale}"
    assert not fl.dev_over_limit(list(functions.values()), 100)
