#!/usr/bin/env python3
"""Function lengths of the library and of the development packages: Python counted with ``ast``,
C++ with a brace count.

The house rule (issue 26, ../shared/STYLE.md) is that no function of the library's Python exceeds
100 lines and no C++ function exceeds 120. This script measures that and exits 1 with the list
of offenders, so ``make test`` (tests/test_function_lengths.py) keeps it true.

- Python: every ``def`` and ``async def`` of the wheel's modules, nested ones included, measured
  as ``end_lineno - lineno + 1`` (the ``def`` line to the last line of its body; decorators are
  not counted). The scope is the wheel's packages as ``pyproject.toml`` maps them
  (``[tool.scikit-build.wheel.packages]``) minus ``wheel.exclude``, so it follows the packaging.
- The development packages' Python (``bench/rhino_bench``, the benchmarks; ``testing/rhino_testing``,
  the harness and workloads the tests and benchmarks share), measured the same way against the same
  limit. The functions that exceeded it when the check first covered them are listed in
  ``DEV_OVER_LIMIT`` with their length then: each may shrink but not grow, and no other may exceed.
- C++: every function definition in ``src/cpp/`` and ``bindings/`` (``*.cc``, ``*.h``): a
  ``{ ... }`` block at namespace or class scope whose opening text looks like a function signature
  (not a namespace, class, struct, union, enum or initializer), measured from the first line of its
  signature to its closing brace. Comments, string and character literals (raw strings included)
  and preprocessor lines are blanked first, so a brace inside them does not count; a lambda inside
  a function is part of that function.

Usage::

    python3 tools/function_lengths.py                 # check: exit 1 and list what exceeds
    python3 tools/function_lengths.py --top 15        # also list the 15 longest of each language
    python3 tools/function_lengths.py --max-py 100 --max-cpp 120 --lang py
    python3 tools/function_lengths.py --lang dev --top 10      # the benchmarks' and testing package's

Standard library only: it runs with any Python 3.10+, without the extension built.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPP_DIRS = ("src/cpp", "bindings")
CPP_SUFFIXES = (".cc", ".h")
# The development packages: source directory -> package name.
DEV_PACKAGES = {"bench/rhino_bench": "rhino_bench", "testing/rhino_testing": "rhino_testing"}
# Development functions over the Python limit when this check first covered them (issue 44), with
# their length then: debts to pay down, which may not grow. Remove an entry once it fits the limit.
DEV_OVER_LIMIT = {
    "rhino_bench.demo.spark:main": 315,
    "rhino_testing.harness.power_loss_fs:_make_operations": 285,  # the FUSE operations, closures over one state
    "rhino_bench.handover:run_one": 140,
    "rhino_bench.demo.dataplane:run_demo": 134,
    "rhino_bench.restore:measure_size": 131,
    "rhino_bench.spark.output_report:report": 106,
    "rhino_bench.service:run": 115,
    "rhino_bench.overhead:run_phase": 103,
}

@dataclass(frozen=True)
class Function:
    lang: str  # "py" or "cpp"
    path: str  # relative to the repository
    line: int  # first line (the def line; the signature's first line in C++)
    name: str  # Python: module:qualname; C++: the (qualified) name as written, with enclosing classes
    length: int  # lines, first to last inclusive

    def where(self) -> str:
        return f"{self.path}:{self.line}"


# ---- the wheel's Python modules -------------------------------------------------------------------


def _load_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return _scan_wheel_tables(path.read_text())
    with path.open("rb") as f:
        return tomllib.load(f)


def _scan_wheel_tables(text: str) -> dict:
    """Just enough TOML for the two keys read here, for a Python 3.10 without tomli."""
    packages: dict[str, str] = {}
    exclude: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            section = line.strip("[] ")
        elif section == "tool.scikit-build.wheel.packages" and "=" in line:
            key, value = (part.strip().strip('"') for part in line.split("=", 1))
            packages[key] = value
        elif section == "tool.scikit-build" and line.startswith("wheel.exclude"):
            exclude = re.findall(r'"([^"]*)"', line)
    wheel = {"packages": packages, "exclude": exclude}
    return {"tool": {"scikit-build": {"wheel": wheel}}}


def wheel_packages(repo: Path = REPO) -> tuple[dict[str, str], list[str]]:
    """({package path in the wheel: source directory}, wheel.exclude patterns) from pyproject.toml."""
    config = _load_toml(repo / "pyproject.toml").get("tool", {}).get("scikit-build", {})
    wheel = config.get("wheel", {})
    packages = wheel.get("packages")
    if isinstance(packages, list):  # the list form: each directory keeps its name
        packages = {Path(p).name: p for p in packages}
    exclude = list(wheel.get("exclude", []))
    return dict(packages or {}), exclude


def wheel_modules(repo: Path = REPO) -> list[tuple[Path, str]]:
    """(file, dotted module name) of every Python module the wheel ships, sorted by file."""
    packages, exclude = wheel_packages(repo)
    # A package nested in another's directory (rhino/spark inside rhino/) is listed under its own name.
    sources = {(repo / src).resolve(): dest for dest, src in packages.items()}
    found: dict[Path, str] = {}
    for src_dir, dest in sorted(sources.items(), key=lambda item: len(str(item[0]))):
        for path in sorted(src_dir.rglob("*.py")):
            rel_src = path.relative_to(src_dir)
            wheel_path = f"{dest}/{rel_src.as_posix()}"
            if any(fnmatch.fnmatch(wheel_path, pat) or fnmatch.fnmatch(wheel_path, pat.rstrip("/") + "/*")
                   for pat in exclude):
                continue
            parts = wheel_path[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            found[path] = ".".join(parts)  # a longer (more specific) source directory wins
    return sorted(found.items())


def dev_modules(repo: Path = REPO) -> list[tuple[Path, str]]:
    """(file, dotted module name) of every Python module of the development packages."""
    found = []
    for src, package in DEV_PACKAGES.items():
        for path in sorted((repo / src).rglob("*.py")):
            parts = [package, *path.relative_to(repo / src).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found.append((path, ".".join(parts)))
    return found


def dev_over_limit(functions: list[Function], limit: int) -> list[Function]:
    """The development functions over ``limit`` that ``DEV_OVER_LIMIT`` does not allow (or that grew)."""
    return [f for f in functions if f.length > max(limit, DEV_OVER_LIMIT.get(f.name, 0))]


def python_functions(path: Path, module: str, repo: Path = REPO) -> list[Function]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(repo).as_posix()
    out: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                out.append(Function("py", rel, child.lineno, f"{module}:{qualname}",
                                    child.end_lineno - child.lineno + 1))
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


# ---- C++: a brace count ---------------------------------------------------------------------------

_RAW_STRING = re.compile(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(')


def blank_cpp(text: str) -> str:
    """The source with comments, string and character literals and preprocessor lines replaced by
    spaces (newlines kept, so line numbers stay right)."""
    out: list[str] = []
    i, n = 0, len(text)
    at_line_start = True  # only whitespace so far on this line: a '#' starts a directive

    def blank(segment: str) -> str:
        return re.sub(r"[^\n]", " ", segment)

    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#":  # a directive, with its backslash continuations
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i:j]))
            i = j
            continue
        if c in " \t\r\f\v":
            out.append(c)
            i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
        elif (m := _RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('"' + blank(text[i + 1:j - 1]) + '"')
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + blank(text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


_CONTAINER_KEYWORDS = {"namespace", "class", "struct", "union", "extern"}
_SKIPPED_KEYWORDS = {"enum"}  # an enum's body holds no function
_ACCESS = re.compile(r"^(?:public|private|protected)\s*$")
_IDENT_TAIL = re.compile(r"[A-Za-z0-9_>]$")
_NOT_FUNCTION_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas",
                       "static_assert"}


def _strip_template_prefix(header: str) -> str:
    """`template <typename T, ...> void f()` -> `void f()`, and leading [[attributes]]."""
    while True:
        header = header.lstrip()
        if header.startswith("[["):
            end = header.find("]]")
            if end < 0:
                return header
            header = header[end + 2:]
            continue
        m = re.match(r"template\s*<", header)
        if not m:
            return header
        depth, j = 1, m.end()
        while j < len(header) and depth:
            depth += {"<": 1, ">": -1}.get(header[j], 0)
            j += 1
        header = header[j:]


def _top_level(header: str, chars: str) -> list[int]:
    """Positions of `chars` in header outside (), [] and {}."""
    depth, hits = 0, []
    for j, ch in enumerate(header):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch in chars:
            hits.append(j)
    return hits


def _has_init_list(header: str) -> bool:
    """A constructor's `) : member_(...)`: a single ':' after the parameter list, outside parentheses."""
    close = header.find(")")
    if close < 0:
        return False
    rest = header[close + 1:]
    return any(rest[j - 1:j] != ":" and rest[j + 1:j + 2] != ":" for j in _top_level(rest, ":"))


def _parameter_list(h: str) -> int:
    """Where the parameter list opens: the first '(' outside <>, () and []; -1 if none."""
    angle = depth = 0
    for j, ch in enumerate(h):
        if ch == "(" and angle == 0 and depth == 0:
            return j
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "<" and depth == 0:
            angle += 1
        elif ch == ">" and depth == 0 and h[j - 1:j] != "-":
            angle = max(0, angle - 1)
    return -1


_QUALIFIER = r"(?:[A-Za-z_]\w*(?:<[^()]*?>)?\s*::\s*)*"


def function_name(header: str) -> str | None:
    """The name of the function a block's opening text declares, or None if it declares none."""
    h = " ".join(_strip_template_prefix(header).split())
    op = re.search(r"\boperator\b", h)
    if op and not _top_level(h[: op.start()], "=("):  # operator(), operator==, operator bool, ...
        symbol = re.match(r"\s*(\(\s*\)|[^(]*?)\s*\(", h[op.end():])
        if symbol is None:
            return None
        qualifier = re.search(_QUALIFIER + "$", h[: op.start()]).group(0)
        return re.sub(r"\s+", "", qualifier) + "operator" + symbol.group(1).replace(" ", "")
    paren = _parameter_list(h)
    if paren <= 0:
        return None
    before = h[:paren].rstrip()
    if _top_level(before, "="):  # `auto f = [](...)`, `T x = make(...)`: an initializer
        return None
    m = re.search("(" + _QUALIFIER + r"~?[A-Za-z_]\w*)$", before)
    if not m:
        return None
    name = re.sub(r"\s+", "", m.group(1))
    if name.split("::")[-1] in _NOT_FUNCTION_NAMES:
        return None
    return name


def _block_kind(header: str) -> tuple[str, str | None]:
    """What the `{` after `header` opens: ("container", class name or None) for a namespace, class,
    struct, union or extern "C"; ("function", name); ("init", None) for a constructor's member
    initializer braces; ("other", None) for anything else (enum, initializer, array)."""
    h = _strip_template_prefix(header).strip()
    words = re.findall(r"[A-Za-z_]\w*", h)
    first = words[0] if words else ""
    if first in _SKIPPED_KEYWORDS or (first == "typedef" and "enum" in words[:3]):
        return "other", None
    if first in _CONTAINER_KEYWORDS or (first == "typedef" and words[1:2] and words[1] in _CONTAINER_KEYWORDS):
        if first in ("class", "struct", "union") and "(" not in h.split(":")[0]:
            name = re.match(r"(?:class|struct|union)\s+(?:\w+\s*\(.*?\)\s*)?(?:\[\[.*?\]\]\s*)?"
                            r"([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)?", h)
            return "container", (re.sub(r"\s+", "", name.group(1)) if name and name.group(1) else None)
        if first in ("namespace", "extern"):
            return "container", None
    if _has_init_list(h) and _IDENT_TAIL.search(h.rstrip()) and not re.search(r"\b(?:const|override|final|noexcept|"
                                                                              r"mutable)\s*$", h):
        return "init", None
    name = function_name(h)
    if name is not None:
        return "function", name
    return "other", None


def cpp_functions_in_text(text: str, rel: str = "<text>") -> list[Function]:
    """Function definitions in one C++ source text, with their lengths."""
    code = blank_cpp(text)
    out: list[Function] = []
    # The stack of open blocks: (kind, name, start line). Kinds as _block_kind; "body" for a
    # function body, whose inner braces (statements, lambdas, initializers) are only counted.
    stack: list[tuple[str, str | None, int]] = []
    header: list[str] = []  # the text since the last ';', '{' or '}' at namespace/class scope
    header_line = 0
    paren = 0
    line = 1
    for ch in code:
        if ch == "\n":
            line += 1
        in_scope = all(kind == "container" for kind, _, _ in stack)
        if not in_scope:  # inside a function body or an initializer: count braces only
            if ch == "{":
                stack.append(("nested", None, line))
            elif ch == "}":
                kind, name, start = stack.pop()
                if kind == "body":
                    out.append(Function("cpp", rel, start, name or "?", line - start + 1))
                    header, paren = [], 0
                elif kind in ("other", "init") and all(k == "container" for k, _, _ in stack):
                    header.append(" {} ")  # the header goes on: `int x[] = {..};`, `a_{1}, b_(2) {`
            continue
        if ch == "{" and paren == 0:
            text_so_far = "".join(header)
            kind, name = _block_kind(text_so_far)
            if kind == "function":
                classes = [n for k, n, _ in stack if k == "container" and n]
                qualified = "::".join(classes + [name]) if classes else name
                stack.append(("body", qualified, header_line or line))
            elif kind == "container":
                stack.append(("container", name, line))
                header, paren = [], 0
            else:
                stack.append((kind, None, line))
            continue
        if ch == "}" and paren == 0:
            if stack:
                stack.pop()
            header, paren = [], 0
            continue
        if ch == ";" and paren == 0:
            header, paren = [], 0
            continue
        if ch in "([":
            paren += 1
        elif ch in ")]":
            paren = max(0, paren - 1)
        if not "".join(header).strip() and not ch.isspace():
            header_line = line
        header.append(ch)
        if ch == ":" and _ACCESS.match("".join(header)[:-1].strip()):
            header = []  # `public:` ends nothing, but begins the next declaration
    return out


def cpp_functions(repo: Path = REPO) -> list[Function]:
    out: list[Function] = []
    for top in CPP_DIRS:
        for path in sorted((repo / top).rglob("*")):
            if path.suffix in CPP_SUFFIXES and path.is_file():
                out.extend(cpp_functions_in_text(path.read_text(errors="replace"), path.relative_to(repo).as_posix()))
    return out


# ---- report ---------------------------------------------------------------------------------------


def _table(functions: list[Function]) -> str:
    return "\n".join(f"  {f.length:5d}  {f.name}  ({f.where()})" for f in functions)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check that no library function exceeds its line limit.")
    p.add_argument("--max-py", type=int, default=100, help="most lines of a Python function (default: %(default)s)")
    p.add_argument("--max-cpp", type=int, default=120, help="most lines of a C++ function (default: %(default)s)")
    p.add_argument("--top", type=int, default=0, metavar="N", help="also list the N longest functions of each language")
    p.add_argument("--lang", choices=["py", "cpp", "dev", "all"], default="all",
                   help="what to measure: the wheel's Python, the C++, the development packages' Python, or all")
    p.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this script's)")
    args = p.parse_args(argv)
    repo = args.repo.resolve()

    measured: dict[str, list[Function]] = {}
    if args.lang in ("py", "all"):
        measured["py"] = [f for path, mod in wheel_modules(repo) for f in python_functions(path, mod, repo)]
    if args.lang in ("cpp", "all"):
        measured["cpp"] = cpp_functions(repo)
    if args.lang in ("dev", "all"):
        measured["dev"] = [f for path, mod in dev_modules(repo) for f in python_functions(path, mod, repo)]
    limits = {"py": args.max_py, "cpp": args.max_cpp, "dev": args.max_py}
    titles = {"py": "Python (the wheel's modules)", "cpp": "C++ (src/cpp, bindings)",
              "dev": f"Python (the development packages: {', '.join(DEV_PACKAGES)}; "
                     f"{len(DEV_OVER_LIMIT)} listed in DEV_OVER_LIMIT)"}

    over: list[Function] = []
    for lang, functions in measured.items():
        longest = sorted(functions, key=lambda f: (-f.length, f.path, f.line))
        print(f"{titles[lang]}: {len(functions)} functions, limit {limits[lang]} lines, "
              f"longest {longest[0].length if longest else 0}")
        if args.top > 0:
            print(_table(longest[: args.top]))
        over.extend(dev_over_limit(longest, limits[lang]) if lang == "dev"
                    else [f for f in longest if f.length > limits[lang]])
    if over:
        print(f"\n{len(over)} function(s) exceed the limit:", file=sys.stderr)
        print(_table(over), file=sys.stderr)
        return 1
    print("OK: no function exceeds its limit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
