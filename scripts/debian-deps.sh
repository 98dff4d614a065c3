#!/usr/bin/env bash
# Install the named Debian packages that are missing. Quiet and quick when all are present.
set -euo pipefail
missing=()
for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "note: not root, so not installing Debian packages: ${missing[*]} (tests needing them will skip)" >&2
    exit 0
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps apt from starting squid as a system service: the benchmark starts its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
# Another install running (a CI image's unattended upgrades, a second `make`) holds apt's locks:
# wait for them, up to ten minutes, rather than fail.
wait_locks=(-o DPkg::Lock::Timeout=600)
apt-get "${wait_locks[@]}" update -qq >/dev/null
apt-get "${wait_locks[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
