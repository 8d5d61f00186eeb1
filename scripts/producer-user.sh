#!/usr/bin/env bash
# Creates (or updates) a least-privilege RabbitMQ user for a producer: it may publish jobs to attune.jobs
# and watch, through a server-named queue of its own, the events whose routing keys it was granted; it
# can touch no queue or exchange of the fleet (see docs/publishing-jobs.md#a-least-privilege-producer-user).
#
#   scripts/producer-user.sh NAME PASSWORD [--events-keys REGEX] [--split] [--cancel] [--vhost VHOST] [--rabbitmq-dir DIR]
#
# --events-keys REGEX: the binding keys NAME may use on attune.events, as a regular expression (topic
# authorisation), e.g. '^digits\.' for every event of model digits, or '^digits\.{username}\.' for those of
# the Attune user whose id is the RabbitMQ user's name (RabbitMQ expands {username}). Without it, no events.
# --split: two users instead of one, NAME to publish and NAME-events (same password) to watch; see below why.
# --cancel: may also publish CancelRequests to attune.cancel. Off by default: a cancel names any job id, of
# any user, so grant it only to a producer trusted with every job it can reach that way.
# --vhost: default /.
# --rabbitmq-dir DIR: a throwaway node started by scripts/rabbitmq.sh or scripts/services.sh (its folder);
# without it, RABBITMQCTL (default: rabbitmqctl on PATH, as on the broker's host) is used as it is.
# Running it again replaces the user's password and grants with these: it is idempotent.
set -euo pipefail

usage() { echo "usage: $0 NAME PASSWORD [--events-keys REGEX] [--split] [--cancel] [--vhost VHOST] [--rabbitmq-dir DIR]" >&2; exit 2; }
[ $# -ge 2 ] || usage
name=$1 password=$2; shift 2
events_keys='' vhost=/ split=0 cancel=0 rmq_dir=${ATTUNE_RABBITMQ_DIR:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --events-keys) events_keys=${2:?--events-keys needs a REGEX}; shift 2 ;;
    --vhost) vhost=${2:?--vhost needs a name}; shift 2 ;;
    --split) split=1; shift ;;
    --cancel) cancel=1; shift ;;
    --rabbitmq-dir) rmq_dir=${2:?--rabbitmq-dir needs a DIR}; shift 2 ;;
    *) usage ;;
  esac
done

# The broker's own rabbitmqctl, or the throwaway node's (scripts/rabbitmqctl.sh).
here=$(cd "$(dirname "$0")" && pwd)
ctl() {
  if [ -n "$rmq_dir" ]; then "$here/rabbitmqctl.sh" "$rmq_dir" "$@"; else ${RABBITMQCTL:-rabbitmqctl} "$@"; fi
}

# The regular expressions match whole resource names (RabbitMQ matches them unanchored, hence ^…$).
# configure: only the queues the broker names for it (amq.gen-…; a client cannot declare such a name
#   itself, and the broker's are exclusive to their connection). Nothing of the fleet: no queue.declare,
#   queue.delete, exchange.declare or exchange.delete on attune.*.
# write: publish to attune.jobs, and bind its own queue (queue.bind checks write on the queue).
# read: bind to attune.events (queue.bind checks read on the exchange) and consume its own queue. No
#   partition, retry, dead-letter or cancel queue: no basic.get, basic.consume or queue.purge on them, and no
#   binding to attune.jobs, whose messages carry every user's samples.
# Topic authorisation on attune.events: binding keys must match --events-keys (read); nothing may be
# published to it (write '^$'; it lacks write on the exchange anyway). A user without topic permissions on an
# exchange is allowed every key, so the entry is always set; '^$' matches no key a worker publishes.
#
# One gap no grant of a single user closes: write on attune.jobs plus read on attune.events also allow
# exchange.bind (destination attune.jobs, source attune.events, a granted key), which would feed the model's
# events back into the job queues, where each is refused and its `failed` event fed back again, for ever
# (with --cancel, into attune.cancel: every event would cancel its job). --split closes it with two users:
# NAME only publishes (write, nothing else), NAME-events only watches (no write on any exchange).
publish_write='^attune\.jobs$' publish_names='attune\.jobs'
if [ "$cancel" = 1 ]; then publish_write='^attune\.(jobs|cancel)$' publish_names='attune\.(jobs|cancel)'; fi
watch_configure='^amq\.gen-.*$' watch_write='^amq\.gen-.*$' watch_read='^(attune\.events|amq\.gen-.*)$'
topic_read=${events_keys:-'^$'}

# grant USER CONFIGURE WRITE READ TOPIC_READ: the user with this password, these grants and no others.
grant() {
  local user=$1
  if ctl list_users | awk '{print $1}' | grep -qxF -- "$user"; then
    ctl change_password "$user" "$password" >/dev/null
  else
    ctl add_user "$user" "$password" >/dev/null
  fi
  ctl set_user_tags "$user" >/dev/null                     # no management or monitoring access
  ctl set_permissions -p "$vhost" "$user" "$2" "$3" "$4" >/dev/null
  ctl clear_topic_permissions -p "$vhost" "$user" >/dev/null # grants of an earlier run on other exchanges
  ctl set_topic_permissions -p "$vhost" "$user" attune.events '^$' "$5" >/dev/null
}

if [ "$split" = 1 ]; then
  grant "$name" '^$' "$publish_write" '^$' '^$'
  grant "$name-events" "$watch_configure" "$watch_write" "$watch_read" "$topic_read"
  echo "producer users on vhost $vhost: $name publishes to $publish_write; $name-events watches events with binding keys matching ${events_keys:-(none)}" >&2
else
  grant "$name" "$watch_configure" "^($publish_names|amq\\.gen-.*)\$" "$watch_read" "$topic_read"
  echo "producer user $name on vhost $vhost: publishes to $publish_write; watches events with binding keys matching ${events_keys:-(none)}" >&2
fi
