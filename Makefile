# One place for every way to build, test, measure and fuzz FabricKV.
# `make test` is what CI runs (.ci/run); it installs what it needs.

CARGO ?= cargo
BIN := target/release/fabrickv
BENCH_DIR := bench-results
DATE := $(shell date +%Y-%m-%d)

.PHONY: all build deps test test-rust bench-smoke lint fmt bench fuzz clean run

all: build

build:
	$(CARGO) build --release --workspace

## Installs system packages the tests and benchmarks use (redis, memcached, iperf3).
deps:
	bash scripts/install-deps.sh

## Everything: Rust unit, property and integration tests, lint, and a tiny run of every benchmark.
test: deps lint test-rust bench-smoke
	@echo "make test: all passed"

test-rust:
	$(CARGO) test --workspace --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Tiny runs of each benchmark so none rots (not measurements).
bench-smoke: build
	$(BIN) bench kv --duration 0.5 --keys 2000 --json
	$(BIN) bench kv --duration 0.5 --keys 2000 --get-percent 100 --server-cpus 0 --client-cpus 1 --compare-redis --json

## Real measurements, written to bench-results/ (see README "Benchmarks").
bench: build deps
	mkdir -p $(BENCH_DIR)
	bash scripts/bench-kv.sh | tee $(BENCH_DIR)/$(DATE)-kv.txt

## Fuzz the wire codec (FUZZ_SECONDS per target, default 60).
fuzz:
	bash scripts/fuzz.sh

## The quick start: a server on 127.0.0.1:7379 with the default config.
run: build
	$(BIN) serve

clean:
	$(CARGO) clean
