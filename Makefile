# One place for every way to build, test, measure and fuzz FabricKV.
# `make test` is what CI runs (.ci/run); it installs what it needs.

CARGO ?= cargo
BIN := target/release/fabrickv
BENCH_DIR := bench-results
DATE := $(shell date +%Y-%m-%d)

.PHONY: all fuzz-check build build-lean build-fabric build-deps deps venv python wheel lint-python test test-stressed test-rust test-python test-torch doc-check module-check bench-smoke lint fmt bench compare fuzz clean run chaos chaos-smoke chaos-check

all: build

## The binary, with every transport (tcp, shm, inproc and libfabric) and
## the benchmarks (`fabrickv bench`, `copy --plot`); it installs libfabric
## first when it is missing.
build: build-deps
	$(CARGO) build --release -p fabrickv-cli --features fabric,bench

## The binary without the benchmarks (no fabrickv-bench linked in), built
## and checked by its own test (crates/cli/tests/lean.rs): the product must
## never come to need the benchmark code. A debug build, on the test
## build's dependencies.
build-lean: build-deps
	$(CARGO) test -p fabrickv-cli --no-default-features --features fabric --test lean

## The same binary (the libfabric transport is built in by default).
build-fabric: build

## libfabric and libclang, which the libfabric transport builds against,
## and protoc, which etcd-client's build runs.
build-deps:
	bash scripts/install-build-deps.sh

## Installs system packages the tests and benchmarks use (redis, memcached,
## iperf3, stress-ng, libfabric).
deps: build-deps
	bash scripts/install-deps.sh

## The project's Python environment (.venv) with what the Python tests use.
venv:
	bash scripts/venv.sh

## The `fabrickv` Python module (crates/python), release build, installed
## into .venv with maturin.
python: venv
	bash scripts/python.sh

## The tests that use torch, in .venv-torch (downloads torch; not part
## of `make test`).
test-torch: python
	bash scripts/test-torch.sh

## The installable wheel in dist/: abi3 (CPython 3.11 and later),
## manylinux, stripped; `pip install dist/fabrickv-*.whl` needs no Rust.
wheel: venv
	bash scripts/wheel.sh

## Everything: Rust unit, property and integration tests, lint, Python
## end-to-end tests, and a tiny run of every benchmark.
test: deps lint lint-python fuzz-check module-check test-rust build-lean test-python doc-check bench-smoke chaos-check chaos-smoke
	@echo "make test: all passed"

## `make test` while stress-ng keeps every core busy: the suite must pass on
## a loaded machine (tests wait on conditions, never on tight sleeps).
test-stressed: deps
	bash scripts/test-stressed.sh

## Every fuzz target still compiles against the crates it decodes with
## (stable toolchain; running them needs nightly: `make fuzz`).
fuzz-check:
	$(CARGO) check --manifest-path fuzz/Cargo.toml --bins

## No import circles between the modules of any crate.
module-check:
	python3 scripts/module-cycles.py

## Every example of README.md and docs/ run as written, against servers
## the script starts on loopback.
doc-check: build python
	.venv/bin/python scripts/doc-check.py

test-rust:
	$(CARGO) test --workspace --all-targets --all-features

## End-to-end tests through real clients (redis-py, redis-cli, redis-benchmark)
## and the `fabrickv` Python module; the wheel is built first so that
## test_wheel.py installs it into a fresh venv.
test-python: build venv python wheel
	.venv/bin/python -m pytest -q python/tests

## The fault test (docs/chaos.md): a cluster in etcd under kill -9, SIGSTOP
## and network isolation while clients write and read, its history checked
## for linearizability and lost writes; CHAOS_SECONDS long (default 60),
## two copies of each slot once the binary replicates. CHAOS_ARGS adds
## options (--stress, --seed N, ...). Isolation needs root.
CHAOS_SECONDS ?= 60
chaos: deps build python
	.venv/bin/python tests/chaos/chaos.py --seconds $(CHAOS_SECONDS) --replicas auto $(CHAOS_ARGS)

## A 20-second run of it, every kind of fault.
chaos-smoke: deps build python
	.venv/bin/python tests/chaos/chaos.py --seconds 20 --replicas auto $(CHAOS_ARGS)

## The fault test's own tests: the Go checker on hand-made histories and
## the harness's lost-write rule.
chaos-check: venv
	cd tools/linearizability && go vet ./... && go test ./...
	.venv/bin/python -m pytest -q tests/chaos

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

## The Python examples, the front door's benchmarks, and every test file
## and the fixtures they share type-check (mypy --strict) against the
## package's stubs, with mypy.ini's settings for redis-py and pymemcache.
PY_TYPED := python/examples python/bench_front_door.py python/bench_ps.py \
	python/tests/conftest.py python/tests/dlpack_util.py \
	python/tests/test_buffers.py python/tests/test_batched.py python/tests/test_blocks.py \
	python/tests/test_async.py python/tests/test_wheel.py python/tests/test_cache.py \
	python/tests/test_cluster.py python/tests/test_checkpoint.py \
	python/tests/test_large_values.py python/tests/test_client_kv.py python/tests/test_ps.py \
	python/tests/test_resp.py python/tests/test_resp3.py python/tests/test_resp_txn.py \
	python/tests/test_memcache.py python/tests/test_auth.py python/tests/test_redis_cluster.py \
	python/tests/test_replication.py python/tests/test_lmcache_cluster.py \
	python/tests/test_growth.py
lint-python: venv python
	.venv/bin/python -m mypy --strict $(PY_TYPED)

fmt:
	$(CARGO) fmt --all

## Tiny runs of each benchmark so none rots (not measurements).
bench-smoke: build python
	$(BIN) bench kv --duration 0.5 --keys 2000 --json
	$(BIN) bench kv --duration 0.5 --keys 2000 --get-percent 100 --server-cpus 0 --client-cpus 1 --compare-redis --json
	$(BIN) bench herd --workers 1,2 --keys-per-partition 2000 --duration 0.3 --json
	$(BIN) bench partition-move --keys 2000 --steady 0.3 --moving 0.3 --json
	$(BIN) bench herd --transport shm --workers 1 --keys-per-partition 2000 --duration 0.3 --server-cpus 0 --client-cpus 1 --json
	$(BIN) bench herd --clients 2 --keys-per-partition 2000 --duration 0.3 --json
	$(BIN) bench compare --keys 2000 --duration 0.3 --depths 1,16 --mget 10 --json
	$(BIN) bench bigvalue --value-size 4MB --requests 3 --rounds 1 --json
	$(BIN) bench ps --key-space-m 0.002 --duration 0.3 --json
	$(BIN) bench ps --transport shm --matrix --key-space-m 0.002 --duration 0.1 --server-cpus 0 --client-cpus 1 --json
	$(BIN) bench ps --clients 2 --key-space-m 0.002 --duration 0.3 --json
	$(BIN) bench ps --compare --rounds 2 --key-space-m 0.002 --async-req 16 --duration 0.3 --server-cpus 0 --client-cpus 1 --json
	$(BIN) bench ps --compare --key-space-m 0.002 --async-req 16 --duration 0.3 --server-workers 2 --thread-num 2 --server-cpus 0,1 --client-cpus 0,1 --json
	.venv/bin/python python/bench_ps.py --bin $(BIN) --duration 0.3 --rounds 1
	.venv/bin/python python/bench_front_door.py --bin $(BIN) --duration 0.2 --rounds 1 --only pull_out,async_pull,exists_many,get_many_into,get_many_into_any
	$(BIN) bench cache --num-keys 64 --value-size 64KB --num-threads 2 --warmup 10 --compare --rounds 2 --json
	$(BIN) bench cache --num-keys 64 --value-size 600KB --num-threads 2 --warmup 10 --depth 4 --compare --json
	$(BIN) bench cache --transport shm --num-keys 16 --value-size 1MB --num-threads 2 --buffer-mb 4 --warmup 10 --server-cpus 0 --client-cpus 1 --compare --rounds 2 --json
	$(BIN) bench cache --transport fabric --provider shm --num-keys 32 --value-size 100KB --num-threads 2 --buffer-mb 4 --warmup 10 --json
	$(BIN) bench copy --size 8MB --value-size 256 --dir $$(mktemp -d) --clean --plot $$(mktemp --suffix .png)
	$(BIN) bench copy --size 4MB --value-size 128 --ranges 3 --parallelism 3 --dir $$(mktemp -d) --clean
	$(BIN) bench cluster --keys 5000 --duration 0.2 --rounds 1 --joins 3 --json
	$(BIN) bench replication --keys 500 --duration 0.2 --rounds 1 --kills 1 --json
	$(BIN) bench checkpoint --embedding-keys 20000 --kv-keys 20000 --load-seconds 0.3 --compare --json
	$(BIN) bench growth --keys 2000 --steady 0.3 --json
	$(BIN) bench mget --calls 200 --rounds 2 --groups 4 --json
	$(BIN) bench cluster --transport shm --servers 2 --keys 2000 --duration 0.1 --rounds 2 --joins 2 --json
	$(BIN) bench rpc --transport inproc --duration 0.3 --report-every 0 --json
	$(BIN) bench rpc --transport tcp --duration 0.3 --report-every 0 --affinity random --server-threads 2 --client-threads 2 --json
	$(BIN) bench rpc --transport shm --duration 0.3 --report-every 0 --server-cpus 0 --client-cpus 1 --compare --json
	$(BIN) bench rpc --transport fabric --provider shm --duration 0.3 --report-every 0 --server-cpus 0 --client-cpus 1 --compare --json
	$(BIN) bench rpc --transport fabric --provider 'tcp;ofi_rxm' --duration 0.3 --report-every 0 --json
	$(BIN) bench auth --rounds 2 --connects 10 --gets 200 --json
	$(BIN) bench slabs --memory 8MB --retry-ms 200 --json

## Real measurements, written to bench-results/ (see docs/benchmarks.md).
bench: deps build
	mkdir -p $(BENCH_DIR)
	bash scripts/bench-kv.sh | tee $(BENCH_DIR)/$(DATE)-kv.txt
	bash scripts/bench-rpc.sh | tee $(BENCH_DIR)/$(DATE)-rpc.txt
	bash scripts/bench-herd.sh | tee $(BENCH_DIR)/$(DATE)-herd.txt
	bash scripts/bench-compare.sh | tee $(BENCH_DIR)/$(DATE)-compare.txt
	bash scripts/bench-ps.sh | tee $(BENCH_DIR)/$(DATE)-ps.txt
	bash scripts/bench-cache.sh | tee $(BENCH_DIR)/$(DATE)-cache.txt
	bash scripts/bench-cluster.sh | tee $(BENCH_DIR)/$(DATE)-cluster.txt
	bash scripts/bench-auth.sh | tee $(BENCH_DIR)/$(DATE)-auth.txt
	$(BIN) bench slabs --memory 64MB --retry-ms 60000 --json | tee $(BENCH_DIR)/$(DATE)-slabs.txt
	bash scripts/bench-copy.sh

## FabricKV beside redis-server and memcached (see scripts/bench-compare.sh).
compare: deps build
	mkdir -p $(BENCH_DIR)
	bash scripts/bench-compare.sh | tee $(BENCH_DIR)/$(DATE)-compare.txt

## Fuzz the wire codec (FUZZ_SECONDS per target, default 60).
fuzz:
	bash scripts/fuzz.sh

## The quick start: a server on 127.0.0.1:7379 with the default config.
run: build
	$(BIN) serve

clean:
	$(CARGO) clean
