#!/usr/bin/env bash
# Installs the system packages FabricKV's tests and benchmarks need, once.
# Idempotent: does nothing when everything is already there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# grpcurl, which docs/grpc.md's examples use (checked by make doc-check),
# built with the machine's Go into .tools/bin; Debian 12 does not package it.
if [ ! -x "$root/.tools/bin/grpcurl" ]; then
    if command -v go >/dev/null; then
        echo "installing grpcurl into .tools/bin"
        GOBIN="$root/.tools/bin" GOFLAGS=-mod=mod go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
    else
        echo "warning: no Go toolchain: grpcurl (docs/grpc.md) not installed" >&2
    fi
fi

# porcupine, which the fault test's linearizability checker
# (tools/linearizability, `make chaos`) is built with; a no-op once cached.
if command -v go >/dev/null; then
    (cd "$root/tools/linearizability" && go mod download)
else
    echo "warning: no Go toolchain: the linearizability checker (make chaos) cannot be built" >&2
fi

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v memcached >/dev/null || need+=(memcached)
# memcapable (Debian: memccapable) and memcslap, which check and load the
# memcache front end.
{ command -v memcapable || command -v memccapable; } >/dev/null || need+=(libmemcached-tools)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v taskset >/dev/null || need+=(util-linux)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v ss >/dev/null || need+=(iproute2)
# etcd 3.4, the registry of replicated clusters; tests start their own.
command -v etcd >/dev/null || need+=(etcd-server)
# etcdctl, which the etcd authentication test uses to turn auth on.
command -v etcdctl >/dev/null || need+=(etcd-client)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "installing: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
# Debian starts these as services on install; tests start their own on free ports.
for svc in redis-server memcached etcd; do
  if command -v systemctl >/dev/null; then $SUDO systemctl stop "$svc" 2>/dev/null || true; fi
done
