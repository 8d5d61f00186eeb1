#!/usr/bin/env bash
# rabbitmqctl against a throwaway node started by scripts/rabbitmq.sh or scripts/services.sh:
#   scripts/rabbitmqctl.sh DIR COMMAND [ARGS…]      e.g. scripts/rabbitmqctl.sh /tmp/svc list_queues
# DIR is the node's folder, or the services.sh folder holding it in rabbitmq/. The CLI needs the node's
# name and cookie (in DIR/home), and runs as the rabbitmq user when root, as rabbitmq.sh runs it.
set -euo pipefail
given=${1:?usage: rabbitmqctl.sh DIR COMMAND [ARGS…]}; shift
dir=$given
[ -f "$dir/nodename" ] || dir=$dir/rabbitmq
[ -f "$dir/nodename" ] || { echo "no RabbitMQ node in $given (no nodename file from scripts/rabbitmq.sh)" >&2; exit 1; }
run=()
[ "$(id -u)" = 0 ] && run=(runuser -u rabbitmq --)
exec "${run[@]}" env HOME="$dir/home" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
  /usr/lib/rabbitmq/bin/rabbitmqctl -q -n "$(cat "$dir/nodename")" "$@"
