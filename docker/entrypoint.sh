#!/bin/sh
# Starts the gradwatch server inside the container.
#
# The server listens on 0.0.0.0 inside the container so that a published port reaches it.
# The server refuses a non-loopback bind without a token; compose.yaml publishes the
# port on the host's 127.0.0.1 only, so with no GRADWATCH_TOKEN set this script passes
# --insecure-no-token (reachable from this machine only). Set GRADWATCH_TOKEN before
# publishing the port any further: the server then requires it on every route but
# /healthz. Arguments are appended to `gradwatch serve` (e.g. --import LOG).
set -eu
data=${GRADWATCH_DATA:-/data}
if [ -n "${GRADWATCH_TOKEN:-}" ]; then
  exec gradwatch serve --host 0.0.0.0 --port 8765 --data "$data" "$@"
fi
# An empty GRADWATCH_TOKEN (compose passes one when the variable is unset) means none.
unset GRADWATCH_TOKEN
exec gradwatch serve --host 0.0.0.0 --port 8765 --data "$data" --insecure-no-token "$@"
