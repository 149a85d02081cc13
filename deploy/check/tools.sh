#!/usr/bin/env bash
# The Debian tools `make deploy-check` needs, installed when missing:
#   prometheus, promtool  Debian's prometheus package, unpacked into
#                         .venv/deploy-tools (no service is installed or started)
#   docker-compose        Debian's docker-compose (1.29), to validate compose.yaml
#   systemd-analyze       Debian's systemd
#   kubectl               renders kustomize (`kubectl kustomize`); not in Debian 12,
#                         so it must be on the machine already
# Prints the PATH to use.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS=.venv/deploy-tools
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

apt_updated=""
apt_update() {
    if [ -z "$apt_updated" ]; then
        $SUDO apt-get update -qq >&2
        apt_updated=1
    fi
}

if ! PATH="$TOOLS/usr/bin:$PATH" command -v promtool >/dev/null \
        || ! PATH="$TOOLS/usr/bin:$PATH" command -v prometheus >/dev/null; then
    apt_update
    mkdir -p "$TOOLS"
    deb_dir=$(mktemp -d)
    chmod 755 "$deb_dir"   # apt downloads as _apt
    (cd "$deb_dir" && apt-get download -qq prometheus >&2)
    dpkg-deb -x "$deb_dir"/prometheus_*.deb "$TOOLS"
    rm -rf "$deb_dir"
fi
if ! command -v docker-compose >/dev/null; then
    apt_update
    $SUDO apt-get install -y -qq --no-install-recommends docker-compose >&2
fi
if ! command -v systemd-analyze >/dev/null; then
    apt_update
    $SUDO apt-get install -y -qq --no-install-recommends systemd >&2
fi
if ! command -v kubectl >/dev/null; then
    echo "deploy-check: kubectl (for \`kubectl kustomize\`) is not installed, and Debian 12" \
         "has no package with a current kustomize; install kubectl first" >&2
    exit 1
fi
echo "$PWD/$TOOLS/usr/bin:$PATH"
