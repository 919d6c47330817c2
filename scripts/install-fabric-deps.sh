#!/usr/bin/env bash
# Installs what the libfabric transport (crates/transport-fabric) needs to
# build and test: libfabric 1.17 headers and library, and libclang for
# bindgen. Idempotent: does nothing when everything is present.
set -euo pipefail

PACKAGES=(libfabric-dev libfabric1 libclang-dev clang)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "fabric dependencies already installed: ${PACKAGES[*]}"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "installing: ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
