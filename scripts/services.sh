#!/usr/bin/env bash
# Makes sure the servers the tests need are reachable: Redis on 127.0.0.1:6379 and MariaDB on
# 127.0.0.1:3306 (root, no password). Starts them when installed and stopped; installs them with
# apt-get when missing and running as root; otherwise stops with a clear message.
# The tests also spawn throwaway redis-server / mariadbd processes of their own, so the binaries
# must be installed even when the shared servers run elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS_PORT=${FLASHSALE_TEST_REDIS_PORT:-6379}
MYSQL_PORT=${FLASHSALE_TEST_MYSQL_PORT:-3306}

say() { echo "services: $*" >&2; }
die() { say "$*"; exit 1; }

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_install() {
    can_install || die "$1 is not installed and I cannot install it (need root and apt-get). Install: $*"
    scripts/apt-install.sh services "$@"
}

wait_for() { # what, command...
    local what=$1; shift
    for _ in $(seq 1 100); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "$what did not come up"
}

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
mysql_up() { mariadb-admin --protocol=tcp -h 127.0.0.1 -P "$MYSQL_PORT" -uroot ping 2>/dev/null | grep -q alive; }

ensure_redis() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || apt_install redis-server redis-tools
    if redis_up; then return 0; fi
    say "starting redis-server on $REDIS_PORT"
    mkdir -p /tmp/flashsale-redis
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
        --dir /tmp/flashsale-redis --logfile /tmp/flashsale-redis/redis.log
    wait_for "redis on $REDIS_PORT" redis_up
}

ensure_mariadb() {
    command -v mariadbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 || apt_install mariadb-server mariadb-client
    if mysql_up; then return 0; fi
    say "starting mariadbd on $MYSQL_PORT"
    if [ ! -d /var/lib/mysql/mysql ]; then
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --port="$MYSQL_PORT"
    wait_for "mariadb on $MYSQL_PORT" mysql_up
    # root over TCP with no password, as the tests expect (a no-op where it already is).
    mariadb -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD(''); FLUSH PRIVILEGES;" 2>/dev/null || true
}

ensure_redis
ensure_mariadb
say "redis on 127.0.0.1:$REDIS_PORT and mariadb on 127.0.0.1:$MYSQL_PORT are up"
