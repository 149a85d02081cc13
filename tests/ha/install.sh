#!/bin/sh
# What `make ha` needs beyond the project's own environment, installed only
# when missing: Debian's etcd, PostgreSQL 15, HAProxy and PgBouncer, and a
# virtual environment on Debian's /usr/bin/python3 with Patroni from PyPI (the
# `ha` extra). Patroni and PgBouncer run as the postgres user, who must be able
# to read that environment: the project's own interpreter may live under a
# home folder it cannot enter. Nothing is started here.
set -eu
cd "$(dirname "$0")/../.."

need=""
command -v etcd >/dev/null || need="$need etcd-server"
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need="$need haproxy"
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need="$need pgbouncer"
[ -x /usr/lib/postgresql/15/bin/postgres ] || need="$need postgresql-15"
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need="$need python3-venv"
if [ -n "$need" ]; then
    echo "make ha: installing$need (Debian)"
    # the packages' own services must not start (and hold default ports): a
    # policy-rc.d that says no, for the time of the install, unless one exists
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    trap '[ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d' EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need
fi

venv=.venv-patroni
stamp=$venv/.installed-ha
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet '.[ha]'
    touch "$stamp"
fi
