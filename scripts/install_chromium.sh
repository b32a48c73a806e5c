#!/usr/bin/env bash
# Install Debian's Chromium for the browser test (make test-browser) when no Chromium is present.
# Playwright drives this system browser; nothing downloads a browser of its own.
set -euo pipefail
for c in "${MOESPEC_CHROMIUM:-}" chromium /usr/bin/chromium chromium-browser; do
    if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1; then
        echo "Chromium: $(command -v "$c")"; exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: no Chromium and no apt-get; install Chromium and set MOESPEC_CHROMIUM" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium || { $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium; }
echo "Chromium: $(command -v chromium)"
