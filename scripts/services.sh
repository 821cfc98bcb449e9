#!/usr/bin/env bash
# Makes sure the servers the tests need are reachable: Redis on 127.0.0.1:6379, MariaDB on
# 127.0.0.1:3306 (root, no password), PostgreSQL on 127.0.0.1:5432 (role postgres, no
# password over TCP) and NATS with JetStream on 127.0.0.1:4222. Starts them when installed and stopped; installs them with apt-get when
# missing and running as root; otherwise stops with a clear message.
# The tests also spawn throwaway redis-server / mariadbd processes of their own, so the binaries
# must be installed even when the shared servers run elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS_PORT=${FLASHSALE_TEST_REDIS_PORT:-6379}
MYSQL_PORT=${FLASHSALE_TEST_MYSQL_PORT:-3306}
PG_PORT=${FLASHSALE_TEST_POSTGRES_PORT:-5432}
NATS_PORT=${FLASHSALE_TEST_NATS_PORT:-4222}

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

pg_up() { pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; }
# The tests' way in: the role postgres over TCP, never asked for a password.
pg_trusted() { psql -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc 'SELECT 1' 2>/dev/null | grep -q 1; }
as_postgres() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }

# Debian's clusters (pg_lsclusters): the one on PG_PORT, else a new one of the newest version.
pg_cluster() {
    local cluster
    cluster=$(pg_lsclusters -h 2>/dev/null | awk -v port="$PG_PORT" '$3 == port { print $1 " " $2; exit }')
    if [ -z "$cluster" ]; then
        local version
        version=$(ls /usr/lib/postgresql | sort -n | tail -1)
        say "creating a PostgreSQL $version cluster on $PG_PORT"
        pg_createcluster "$version" main --port "$PG_PORT" >/dev/null
        cluster="$version main"
    fi
    echo "$cluster"
}

ensure_postgres() {
    command -v pg_ctlcluster >/dev/null 2>&1 && command -v psql >/dev/null 2>&1 || apt_install postgresql postgresql-client
    local cluster
    if ! pg_up; then
        cluster=$(pg_cluster)
        say "starting PostgreSQL $cluster on $PG_PORT"
        # shellcheck disable=SC2086
        pg_ctlcluster $cluster start
        wait_for "postgresql on $PG_PORT" pg_up
    fi
    if pg_trusted; then return 0; fi
    # Running, but asks the tests for a password: trust the role postgres from 127.0.0.1
    # (a line ahead of the others), then reload; the running server keeps its connections.
    [ "$(id -u)" = 0 ] || die "postgres on $PG_PORT asks for a password; add 'host all postgres 127.0.0.1/32 trust' to pg_hba.conf"
    local hba
    hba=$(as_postgres "psql -w -p $PG_PORT -tAc 'SHOW hba_file'")
    say "trusting the role postgres over TCP from 127.0.0.1 ($hba)"
    sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
    as_postgres "psql -w -p $PG_PORT -tAc 'SELECT pg_reload_conf()'" >/dev/null
    wait_for "postgres to trust the role postgres over TCP" pg_trusted
}

nats_up() { exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT" && head -n 1 <&3 | grep -q '"jetstream":true'; }

# The order-event tests' shared broker (tests that kill one spawn their own).
ensure_nats() {
    command -v nats-server >/dev/null 2>&1 || apt_install nats-server
    if timeout 2 bash -c "$(declare -f nats_up); NATS_PORT=$NATS_PORT nats_up"; then return 0; fi
    say "starting nats-server with JetStream on $NATS_PORT"
    mkdir -p /tmp/flashsale-nats
    nohup nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd /tmp/flashsale-nats \
        >/tmp/flashsale-nats/nats.log 2>&1 &
    wait_for "nats on $NATS_PORT" timeout 2 bash -c "$(declare -f nats_up); NATS_PORT=$NATS_PORT nats_up"
}

ensure_redis
ensure_mariadb
ensure_postgres
ensure_nats
say "redis on 127.0.0.1:$REDIS_PORT, mariadb on 127.0.0.1:$MYSQL_PORT, postgresql on 127.0.0.1:$PG_PORT and nats on 127.0.0.1:$NATS_PORT are up"
