#!/bin/sh
# The demo writer of docker-compose.yml: one event a second through outbox_publish(), as the
# least-privileged writer role (INSERT and the function only), over 10 keys.
set -eu
i=0
while true; do
  i=$((i + 1))
  psql -v ON_ERROR_STOP=1 -qAt \
    -c "SELECT outbox_publish('order.paid', 'order-' || ($i % 10), jsonb_build_object('n', $i, 'at', now()))" \
    > /dev/null
  sleep "${WRITER_INTERVAL:-1}"
done
