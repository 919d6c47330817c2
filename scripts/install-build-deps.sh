#!/usr/bin/env bash
# Installs what the build needs from the system: libfabric 1.17 headers and
# library and libclang for bindgen (the libfabric transport,
# crates/transport-fabric), and protoc, which etcd-client's build script
# runs on etcd's API definitions (crates/cluster), with the well-known types. Idempotent: does nothing
# when everything is present.
set -euo pipefail

PACKAGES=(libfabric-dev libfabric1 libclang-dev clang protobuf-compiler libprotobuf-dev)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "build dependencies already installed: ${PACKAGES[*]}"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "installing: ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
