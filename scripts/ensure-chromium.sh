#!/usr/bin/env bash
# Make sure a headless-capable Chromium is installed for the status page test
# (tests/integration/status): Debian's `chromium` with apt-get when we are root,
# otherwise say how to get it. The test is skipped, with that reason, without it.
set -euo pipefail
if [ -n "${SLUICE_CHROMIUM:-}" ] && [ -x "${SLUICE_CHROMIUM}" ]; then
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium not found: installing it with apt-get (for the status page test)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
  command -v chromium >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
chromium was not found; the status page test (tests/integration/status) will be skipped.
  Debian/Ubuntu: sudo apt-get install chromium
  or set SLUICE_CHROMIUM to a Chromium or Chrome binary.
MSG
exit 0
