"""The jar of rhino.spark's JVM helpers: placement-aware scheduling
(``io.rhino.spark.PreferredLocationsRDD``) and routing rows to instances without a Python
pass (``io.rhino.spark.KeyRouter``, used by ``runtime/routing.py``).

How the jar is found, in this order (:func:`jar_path`):

1. ``$RHINO_SPARK_JAR``, if set: a jar someone built (e.g. for a cluster without a JDK).
2. A jar shipped next to this module, ``jars/rhino-spark-locality-<key>.jar``.
3. The build cache, ``$RHINO_CACHE/spark/`` (default ``~/.cache/rhino/spark/``), same name.
4. Otherwise the Java source, which ships inside the package (``java/io/rhino/spark/*.java``,
   so this works from a wheel too), is compiled with ``javac`` into the cache.

`<key>` is a hash of the Java source, the PySpark version and the javac target: an edited
source or another Spark never picks up a stale jar. The compile takes ~2 s once per
machine. It uses plain ``javac`` against ``pyspark/jars/*``, no Scala compiler, so a JDK
(``javac``), not only a JRE, must be installed; `make setup` installs one.

``python -m rhino.spark.scheduling.jar`` builds (if needed) and prints the path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

__all__ = ["jar_path", "java_sources", "cache_dir", "JAVA_RELEASE", "JDK_HINT"]

JAVA_RELEASE = "17"  # PySpark 4.x runs on Java 17+; a class file for 17 loads on 17 and newer
JDK_HINT = "install a JDK: apt-get install openjdk-17-jdk-headless (a JRE has no javac)"
_HERE = Path(__file__).resolve().parent
_JAVA_ROOT = _HERE / "java"
_NAME = "rhino-spark-locality"


def java_sources() -> list[Path]:
    """The .java files of the helper, in a fixed order."""
    return sorted(_JAVA_ROOT.rglob("*.java"))


def cache_dir() -> Path:
    """Where compiled jars are kept: ``$RHINO_CACHE/spark`` or ``~/.cache/rhino/spark``."""
    base = os.environ.get("RHINO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rhino")
    return Path(base) / "spark"


def _pyspark_home() -> tuple[Path, str]:
    try:
        import pyspark
    except ImportError as e:
        raise ImportError("rhino.spark needs PySpark: pip install 'rhino-state[spark]'") from e
    return Path(pyspark.__file__).resolve().parent, pyspark.__version__


def _key(spark_version: str) -> str:
    h = hashlib.sha256()
    for src in java_sources():
        h.update(src.relative_to(_JAVA_ROOT).as_posix().encode() + b"\0" + src.read_bytes() + b"\0")
    h.update(f"spark={spark_version};release={JAVA_RELEASE}".encode())
    return h.hexdigest()[:16]


def _find_javac() -> str:
    javac = shutil.which("javac")
    if javac is None and os.environ.get("JAVA_HOME"):
        cand = Path(os.environ["JAVA_HOME"]) / "bin" / "javac"
        javac = str(cand) if cand.exists() else None
    if javac is None:
        raise RuntimeError(f"rhino.spark: javac not found, needed once to build the locality helper jar; {JDK_HINT}; "
                           f"or point $RHINO_SPARK_JAR at a prebuilt {_NAME}.jar")
    return javac


def _compile(dest: Path, spark_home: Path) -> Path:
    """javac + a zip with a manifest (no `jar` tool needed); the jar appears atomically, so
    concurrent builders (tests in parallel) never see a half-written one."""
    sources = java_sources()
    if not sources:
        raise RuntimeError(f"rhino.spark: the Java source of the locality helper is missing under {_JAVA_ROOT}")
    javac = _find_javac()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rhino-javac-", dir=dest.parent) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8",
               "-cp", str(spark_home / "jars" / "*"), "-d", str(classes)] + [str(s) for s in sources]
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"rhino.spark: javac failed ({r.returncode}) building the locality helper:\n"
                               f"{r.stderr.strip()[-4000:]}")
        part = Path(tmp) / (dest.name + ".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: rhino.spark\r\n\r\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(part, dest)
    return dest


def jar_path(*, build: bool = True) -> Path:
    """The path of the locality helper's jar (see the module doc for the search order).
    With `build` False, raises FileNotFoundError instead of compiling."""
    env = os.environ.get("RHINO_SPARK_JAR")
    if env:
        p = Path(env)
        if not p.is_file():
            raise FileNotFoundError(f"$RHINO_SPARK_JAR points at {env}, which is not a file")
        return p
    spark_home, version = _pyspark_home()
    name = f"{_NAME}-{_key(version)}.jar"
    for cand in (_HERE / "jars" / name, cache_dir() / name):
        if cand.is_file():
            return cand
    if not build:
        raise FileNotFoundError(f"no {name} in {_HERE / 'jars'} or {cache_dir()}")
    return _compile(cache_dir() / name, spark_home)


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rhino.spark.scheduling.jar",
                                description="Build (if needed) the Spark locality helper jar and print its path.")
    p.add_argument("--into", type=Path, help="also copy the jar into this directory (e.g. to ship it)")
    args = p.parse_args(argv)
    try:
        path = jar_path()
    except (RuntimeError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.into:
        args.into.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, args.into / path.name)
        path = args.into / path.name
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
