#!/usr/bin/env bash
# Installs the system packages FabricKV's tests and benchmarks need, once.
# Idempotent: does nothing when everything is already there.
set -euo pipefail

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v memcached >/dev/null || need+=(memcached)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v taskset >/dev/null || need+=(util-linux)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v ss >/dev/null || need+=(iproute2)
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
for svc in redis-server memcached; do
  if command -v systemctl >/dev/null; then $SUDO systemctl stop "$svc" 2>/dev/null || true; fi
done
