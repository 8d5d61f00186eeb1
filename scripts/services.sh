#!/usr/bin/env bash
# Throwaway PostgreSQL and RabbitMQ for the demo and the tests, as unprivileged processes on loopback
# ports in a temporary folder.
#   eval "$(scripts/services.sh start DIR)"   prints `export ATTUNE_DATABASE_URL=… ATTUNE_AMQP_URL=…` lines
#   scripts/services.sh stop DIR
# Ports: ATTUNE_PG_PORT and ATTUNE_AMQP_PORT, else free ones picked now.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:?usage: services.sh start|stop DIR}
dir=${2:?usage: services.sh start|stop DIR}

case "$cmd" in
  start)
    mkdir -p "$dir"
    pg_port=${ATTUNE_PG_PORT:-$("$here/free-port")}
    amqp_port=${ATTUNE_AMQP_PORT:-}
    # RabbitMQ's distribution port is derived from its AMQP port and must stay below 65536.
    [ -n "$amqp_port" ] && ((amqp_port + 20000 <= 65535)) || amqp_port=$("$here/free-port" --rabbitmq)
    # ATTUNE_TLS=1: both servers also listen with TLS, certificates from a throwaway CA (scripts/tls.sh),
    # and the TLS URLs are printed too (the tests' TLS suite reads them).
    if [ "${ATTUNE_TLS:-0}" = 1 ]; then
      "$here/tls.sh" "$dir/tls"
      export ATTUNE_TLS_DIR=$dir/tls ATTUNE_AMQPS_PORT=${ATTUNE_AMQPS_PORT:-$("$here/free-port")}
    fi
    pg=$("$here/postgres.sh" start "$dir/postgres" "$pg_port")
    amqp=$("$here/rabbitmq.sh" start "$dir/rabbitmq" "$amqp_port")
    db_url=${pg#*=}; amqp_url=${amqp#*=}
    echo "export ATTUNE_DATABASE_URL=$db_url ATTUNE_AMQP_URL=$amqp_url"
    echo "export ATTUNE_TEST_DATABASE_URL=$db_url ATTUNE_TEST_AMQP_URL=$amqp_url"
    # For tests that make broker users and permissions with scripts/rabbitmqctl.sh, and that log in over
    # PostgreSQL's socket, which it trusts (there the server names a role that does not exist).
    echo "export ATTUNE_TEST_RABBITMQ_DIR=$(cd "$dir/rabbitmq" && pwd) ATTUNE_TEST_POSTGRES_SOCKET=$(cd "$dir/postgres/socket" && pwd)"
    if [ -n "${ATTUNE_TLS_DIR:-}" ]; then
      tls=$ATTUNE_TLS_DIR
      client="sslcert=$tls/client.pem&sslkey=$tls/client.key"
      echo "export ATTUNE_TEST_TLS_DIR=$tls"
      echo "export ATTUNE_TEST_DATABASE_TLS_URL='postgresql://attune@localhost:$pg_port/attune?sslmode=verify-full&sslrootcert=$tls/ca.pem&$client'"
      echo "export ATTUNE_TEST_AMQPS_URL='amqps://attune:attune@localhost:$ATTUNE_AMQPS_PORT/%2f?cacertfile=$tls/ca.pem&certfile=$tls/client.pem&keyfile=$tls/client.key'"
    fi
    ;;
  stop)
    "$here/rabbitmq.sh" stop "$dir/rabbitmq" || true
    "$here/postgres.sh" stop "$dir/postgres" || true
    ;;
  *) echo "usage: services.sh start|stop DIR" >&2; exit 2 ;;
esac
