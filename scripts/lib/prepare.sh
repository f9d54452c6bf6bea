# Sourced by scripts/test, scripts/bench and scripts/chaos: install what is
# missing, start MariaDB, PostgreSQL, Redis and a Redis Cluster on loopback if
# they are not running, and install the project with the extras in EXTRAS and
# the dependency groups in DEP_GROUPS into the virtualenv VENV (made with PYTHON).
# Idempotent: a second run skips everything already done.

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-mysql,postgresql,celery,metrics,webhooks}
DEP_GROUPS=${DEP_GROUPS:-test beat lint bench}
REDIS_PORT=${REDIS_PORT:-6379}
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

step() { printf '\n== %s\n' "$*"; }
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

missing=()
# pgbouncer: tests/test_pgbouncer.py starts one of its own per test, on a free loopback port.
for pkg in redis-server mariadb-server libmariadb-dev pkg-config postgresql pgbouncer gettext; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A headless browser for the admin page's browser test: worth trying, not worth failing for
# (the test says why it skips when these are missing).
if [ "${WITH_BROWSER:-1}" = 1 ] && ! dpkg -s chromium chromium-driver >/dev/null 2>&1; then
  step "installing chromium and chromium-driver (the browser test)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "could not install chromium: the browser test will be skipped"
fi

if ! mariadb-admin ping --silent >/dev/null 2>&1; then
  step "starting MariaDB"
  $SUDO service mariadb start >/dev/null
  for _ in $(seq 50); do mariadb-admin ping --silent >/dev/null 2>&1 && break; sleep 0.2; done
fi
if ! mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1; then
  step "allowing root over TCP without a password (loopback test server only)"
  $SUDO mariadb -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
fi

PG_VERSION=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
if [ -n "$PG_VERSION" ] && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  step "starting PostgreSQL $PG_VERSION"
  $SUDO pg_ctlcluster "$PG_VERSION" main start
  for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
fi
if [ -n "$PG_VERSION" ] && ! PGPASSWORD=order_timeout psql -h 127.0.0.1 -U order_timeout -d postgres \
     -tAc 'SELECT 1' >/dev/null 2>&1; then
  step "creating the PostgreSQL role order_timeout (loopback test server only)"
  as_postgres psql -q -c "CREATE ROLE order_timeout LOGIN SUPERUSER PASSWORD 'order_timeout'" \
    2>/dev/null || as_postgres psql -q -c "ALTER ROLE order_timeout LOGIN SUPERUSER PASSWORD 'order_timeout'"
fi

# 64 databases: each test worker takes one of its own (tests/parallel.py).
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  step "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --daemonize yes --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --databases 64 >/dev/null
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

# A local Redis Cluster of 3 masters and 3 replicas on loopback, for the
# tests that run against a cluster (REDIS_CLUSTER_URL). Fresh on every start:
# its nodes keep no data the tests need.
CLUSTER_PORTS=${CLUSTER_PORTS:-"7101 7102 7103 7104 7105 7106"}
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/order-timeout-cluster}
first_port=${CLUSTER_PORTS%% *}
cluster_whole() {
  # Every node answering, not only a cluster that went on without one (a replica promoted after
  # a node was killed is "ok" with five nodes; the tests count six).
  redis-cli -p "$first_port" cluster info 2>/dev/null | grep -q "cluster_state:ok" || return 1
  for port in $CLUSTER_PORTS; do redis-cli -p "$port" ping >/dev/null 2>&1 || return 1; done
}
if [ "${START_CLUSTER:-1}" = 1 ] && ! cluster_whole; then
  step "starting a Redis Cluster on 127.0.0.1:${CLUSTER_PORTS// /,}"
  for port in $CLUSTER_PORTS; do
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  done
  rm -rf "$CLUSTER_DIR"
  for port in $CLUSTER_PORTS; do
    mkdir -p "$CLUSTER_DIR/$port"
    redis-server --daemonize yes --port "$port" --bind 127.0.0.1 --dir "$CLUSTER_DIR/$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --save '' --appendonly no --logfile "$CLUSTER_DIR/$port/redis.log" >/dev/null
  done
  for port in $CLUSTER_PORTS; do
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create $(for port in $CLUSTER_PORTS; do printf '127.0.0.1:%s ' "$port"; done) \
    --cluster-replicas 1 --cluster-yes >/dev/null
  for _ in $(seq 100); do
    redis-cli -p "$first_port" cluster info | grep -q "cluster_state:ok" && break; sleep 0.1
  done
fi

# PIP_UPGRADE=1: every dependency at the newest version the project allows (CI's newest stage).
stamp="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)-${EXTRAS//,/-}-${DEP_GROUPS// /-}-${DJANGO:-any}-${EXTRA_PACKAGES:-}-${PIP_UPGRADE:-0}"
stamp=${stamp//[^A-Za-z0-9._\/=-]/_}
if [ ! -f "$stamp" ]; then
  step "installing the project into $VENV ($("$PYTHON" --version)): about a minute the first time"
  started_at=$SECONDS
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # 25.1 or later: dependency groups (--group).
  echo "upgrading pip"
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=25.1"
  group_args=()
  for group in $DEP_GROUPS; do group_args+=(--group "$group"); done
  # pip's own progress, a line per package (its errors go to stderr, unfiltered), and a
  # line every 15 s while it installs the wheels, which it does without a word.
  ( trap 'kill $! 2>/dev/null; exit 0' TERM
    while :; do sleep 15 & wait $!; echo "  still installing ($((SECONDS - started_at)) s)"; done ) &
  heartbeat=$!
  upgrade=()
  [ "${PIP_UPGRADE:-0}" = 1 ] && upgrade=(--upgrade --upgrade-strategy eager)
  pip_status=0
  ( set -o pipefail
    PYTHONUNBUFFERED=1 "$VENV/bin/python" -m pip install --progress-bar off "${upgrade[@]}" -e ".[$EXTRAS]" \
      "${group_args[@]}" ${DJANGO:+"Django$DJANGO"} ${EXTRA_PACKAGES:-} \
      | sed -u -n -E 's/^(Collecting|Installing collected packages|Successfully installed)/  \1/p' ) \
    || pip_status=$?
  kill "$heartbeat" 2>/dev/null || true
  wait "$heartbeat" 2>/dev/null || true
  [ "$pip_status" = 0 ] || { echo "pip install failed (exit $pip_status)" >&2; exit "$pip_status"; }
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

