#!/usr/bin/env bash
# Install the peers of the paper's comparison (bench/paper.py) and of the
# acknowledged round trip (bench/peers/round_trip.py):
#   RabbitMQ, ActiveMQ and Redis from Debian's packages, never started as system
#   services (bench/peers/brokers.py runs them as child processes on
#   127.0.0.1), and their Python clients into the project's virtualenv.
# Idempotent and quiet: a second run installs nothing and prints one line.
#
#   sudo bash bench/peers/setup.sh            # needs root for apt-get
#   PYTHON=/path/to/python bash bench/peers/setup.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-$root/.venv/bin/python}"

# The Python clients, pinned (also the project's optional group `paper`).
CLIENTS=(pika==1.4.4 stomp.py==9.0.0 redis==8.1.0)

DEBS=(rabbitmq-server activemq redis-server)

missing=()
for pkg in "${DEBS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]})); then
    if [[ $EUID -ne 0 ]]; then
        echo "setup.sh: installing ${missing[*]} needs root (apt-get); run it with sudo" >&2
        exit 1
    fi
    # Keep the packages' maintainer scripts from starting the brokers as
    # services: invoke-rc.d asks policy-rc.d, and 101 means "do not start".
    # An existing policy-rc.d is left as it is.
    made_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    cleanup() { if [[ -n "$made_policy" ]]; then rm -f /usr/sbin/policy-rc.d; fi; }
    trap cleanup EXIT
    echo "setup.sh: apt-get install ${missing[*]} (a few minutes)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" > /tmp/raylog-peers-apt.log 2>&1 \
        || { tail -n 30 /tmp/raylog-peers-apt.log >&2; exit 1; }
    # Under systemd the units may be enabled (and started, had no policy
    # stopped it): disable and stop them, so that only bench/peers/brokers.py
    # ever runs these brokers.
    if [[ -d /run/systemd/system ]]; then
        for unit in rabbitmq-server activemq redis-server; do
            systemctl disable --now "$unit" >/dev/null 2>&1 || true
        done
    fi
fi

if ! "$PYTHON" - "${CLIENTS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check "${CLIENTS[@]}" \
        > /tmp/raylog-peers-pip.log 2>&1 \
        || { tail -n 30 /tmp/raylog-peers-pip.log >&2; exit 1; }
fi

echo "setup.sh: peers ready: rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server)," \
     "activemq $(dpkg-query -W -f='${Version}' activemq)," \
     "redis-server $(dpkg-query -W -f='${Version}' redis-server), ${CLIENTS[*]}"
