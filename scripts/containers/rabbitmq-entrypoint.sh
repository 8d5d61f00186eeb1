#!/bin/sh
# RabbitMQ reads RABBITMQ_DEFAULT_USER/PASS itself on a node's first boot; the official image's other defaults
# (every interface, no guest over the network, logs to standard output) are written here.
set -eu
mkdir -p /var/lib/rabbitmq /etc/rabbitmq
chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
if [ ! -f /etc/rabbitmq/rabbitmq.conf ] || [ -w /etc/rabbitmq/rabbitmq.conf ]; then
  cat >/etc/rabbitmq/rabbitmq.conf <<CONF
loopback_users.guest = true
listeners.tcp.default = 5672
management.tcp.port = 15672
log.console = true
log.file = false
CONF
fi
if [ "${1:-}" = rabbitmq-server ]; then exec gosu rabbitmq rabbitmq-server; fi
exec "$@"
