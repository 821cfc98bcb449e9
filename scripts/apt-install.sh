#!/usr/bin/env bash
# Installs Debian packages a test needs: `scripts/apt-install.sh WHO PACKAGE...`. As root, with
# apt-get (waiting for another apt run's lock rather than failing on it) and without starting
# any service a package ships (a policy-rc.d that says "no", where an init system would start
# it). Not as root: says what to run and fails. WHO names the caller in messages.
set -euo pipefail
who=$1; shift

if [ "$(id -u)" != 0 ]; then
    echo "$who: $* missing; install as root:" >&2
    echo "    apt-get update && apt-get install -y $*" >&2
    exit 1
fi
echo "$who: installing $* with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
made_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get -o DPkg::Lock::Timeout=300 update -q >&2
apt-get -o DPkg::Lock::Timeout=300 install -y -q "$@" >&2
if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
