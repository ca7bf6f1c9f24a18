#!/usr/bin/env bash
# Install the server binaries the test-suite runs as its own child processes (DESIGN §5).
#
# Idempotent: installs only what is missing from PATH, so on a prepared machine it does
# nothing and needs no root. Works on Debian/Ubuntu (apt-get); run as root, or as a user
# with sudo. It never starts, stops or enables a system service: the tests start their own
# processes on free ports. (Debian's redis-server, postgresql and pgbouncer packages start a
# service on 6379, 5432 and 6432 when they are installed; that is harmless and left alone, and
# nothing relies on it: the tests run their own initdb'd cluster and their own PgBouncers.)
#
# To add a server: append "binary:package [package...]" to DEPS. "binary" is a command looked
# up on PATH, or an absolute path for files that are not on PATH, e.g.
#   "/usr/share/zookeeper/bin/zkServer.sh:zookeeper"   (Debian 12; pulls in default-jre.
#                                                        Not zookeeperd: that one is a service)
#   "/usr/sbin/mariadbd:mariadb-server"                 (/usr/sbin is not on a user's PATH)
# A binary may be given as alternatives separated by "|", each a command or an absolute path
# (globs allowed): Debian's postgresql package keeps initdb under
# /usr/lib/postgresql/<version>/bin, off PATH, and the tests look in both places.
set -euo pipefail

DEPS=(
    "redis-server:redis-server"
    "/usr/share/zookeeper/bin/zkServer.sh:zookeeper"
    "/usr/share/java/netty-codec.jar:libnetty-java"  # ZooKeeper's secureClientPort (TLS tests)
    "/usr/sbin/mariadbd:mariadb-server"
    "/usr/bin/mariadb-install-db:mariadb-server"
    "initdb|/usr/lib/postgresql/*/bin/initdb:postgresql"
    "/usr/sbin/pgbouncer:pgbouncer"  # in front of PostgreSQL: session and transaction pooling
    "etcd:etcd-server"
    "etcdctl:etcd-client"
)

# present BINARY: true if the command (or absolute path, or glob) "BINARY" exists; with
# "a|b", if any of the alternatives does.
present() {
    local alternative
    IFS='|' read -r -a alternatives <<<"$1"
    for alternative in "${alternatives[@]}"; do
        if [[ $alternative == /* ]]; then
            compgen -G "$alternative" >/dev/null && return 0
        elif command -v "$alternative" >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

missing_packages=()
for dep in "${DEPS[@]}"; do
    binary=${dep%%:*}
    packages=${dep#*:}
    present "$binary" && continue
    echo "install-system-deps: $binary not found; will install: $packages" >&2
    read -r -a pkgs <<<"$packages"
    missing_packages+=("${pkgs[@]}")
done

if ((${#missing_packages[@]} == 0)); then
    echo "install-system-deps: all present (${DEPS[*]%%:*})" >&2
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: apt-get not found; install these packages by hand:" \
        "${missing_packages[*]}" >&2
    exit 1
fi

if ((EUID == 0)); then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo --non-interactive)
else
    echo "install-system-deps: need root to install ${missing_packages[*]}:" \
        "run this script as root, or install sudo" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing_packages[@]}"

# Check that what we installed is now found.
for dep in "${DEPS[@]}"; do
    binary=${dep%%:*}
    present "$binary" || { echo "install-system-deps: $binary still missing" >&2; exit 1; }
done
echo "install-system-deps: installed ${missing_packages[*]}" >&2
