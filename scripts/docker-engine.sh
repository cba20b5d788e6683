#!/usr/bin/env bash
# Makes sure a Docker engine is reachable, starting a private one when none is.
#
# Usage: scripts/docker-engine.sh [start|stop|status] [HOLDER_PID]   (default: start)
#   start   Use the engine that DOCKER_HOST (or the default socket) reaches; when there is
#           none, install Debian's docker.io (and debootstrap, for scripts/docker-base.sh)
#           if missing, start dockerd with its own data root, exec root, socket and
#           pidfile, and wait until it answers. Idempotent: a second call finds the engine
#           the first one started. Prints, one per line, for a caller to read:
#             DOCKER_HOST=unix:///run/gradwatch-docker/docker.sock
#             DOCKER=/usr/bin/docker        (the client to use with that engine)
#             GRADWATCH_DOCKERD_STARTED=1   (1: this call started dockerd; 0: it was up)
#           With HOLDER_PID, the private engine is leased to that process (a file under
#           the state directory) until `stop HOLDER_PID` or the holder's death, and
#             GRADWATCH_DOCKER_LEASED=1     (call `stop HOLDER_PID` when done)
#           is printed too.
#   stop    Without HOLDER_PID: stop the dockerd that this script started (found by its
#           pidfile), if running. With it: end that holder's lease, and stop the engine
#           when no living process holds one and it was started for a holder (two test
#           sessions on one machine share one engine; the first to finish must not stop
#           it under the other, and neither stops an engine someone started by hand).
#   status  Print the same lines as start, or exit 1 when no engine is reachable.
#
# The private engine keeps its images in GRADWATCH_DOCKER_ROOT (default
# /var/lib/gradwatch-docker), so a stop and a later start keep the build cache.
set -euo pipefail

state=${GRADWATCH_DOCKER_STATE:-/run/gradwatch-docker}
data_root=${GRADWATCH_DOCKER_ROOT:-/var/lib/gradwatch-docker}
sock=$state/docker.sock
pidfile=$state/dockerd.pid
logfile=$state/dockerd.log
leases=$state/leases
own_host=unix://$sock
holder=${2:-}

log() { echo "docker-engine: $*" >&2; }

# The client that ships with Debian's dockerd speaks its API and has BuildKit built in;
# another client on PATH (a newer one without the buildx plugin) may not.
client() {
  if [[ -x /usr/bin/docker ]] && dpkg -S /usr/bin/docker >/dev/null 2>&1; then
    echo /usr/bin/docker
  else
    command -v docker || echo docker
  fi
}

answers() { # host -> 0 when an engine answers there
  DOCKER_HOST=$1 "$(client)" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

report() { # host started
  echo "DOCKER_HOST=$1"
  echo "DOCKER=$(client)"
  echo "GRADWATCH_DOCKERD_STARTED=$2"
  if [[ -n $holder && $1 == "$own_host" ]]; then echo "GRADWATCH_DOCKER_LEASED=1"; fi
}

our_pid() { # prints the pid of the dockerd this script started, if it still runs
  [[ -s $pidfile ]] || return 1
  local pid
  pid=$(<"$pidfile")
  [[ -d /proc/$pid ]] && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

lease() { # records that $holder uses the private engine
  [[ -n $holder ]] || return 0
  mkdir -p "$leases"
  : >"$leases/$holder"
}

living_leases() { # prints the holders still alive, forgetting the dead ones
  local f
  for f in "$leases"/*; do
    [[ -e $f ]] || continue
    if [[ -d /proc/${f##*/} ]]; then echo "${f##*/}"; else rm -f "$f"; fi
  done
}

install_missing() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  ((${#need[@]})) || return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    log "missing ${need[*]} and cannot install them (needs root and apt-get)"
    exit 1
  fi
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

start() {
  local existing=${DOCKER_HOST:-unix:///var/run/docker.sock}
  if answers "$existing"; then
    report "$existing" 0
    return
  fi
  if our_pid >/dev/null && answers "$own_host"; then
    lease
    report "$own_host" 0
    return
  fi
  if [[ $(id -u) != 0 ]]; then
    log "no Docker engine answers at $existing, and starting one needs root"
    exit 1
  fi
  install_missing
  if pid=$(our_pid); then
    # Started by an earlier call and still coming up: wait for it below.
    log "dockerd $pid is starting"
  else
    mkdir -p "$state" "$data_root"
    rm -f "$sock" "$pidfile" "$state/for-holders"
    if [[ -n $holder ]]; then : >"$state/for-holders"; fi
    log "starting dockerd (data root $data_root, socket $sock, log $logfile)"
    # setsid: the engine outlives this script and is not killed with the caller's
    # process group; `stop` ends it by its pidfile. 9>&-: it must not hold our lock.
    setsid dockerd \
      --host "$own_host" \
      --data-root "$data_root" \
      --exec-root "$state/exec" \
      --pidfile "$pidfile" \
      >"$logfile" 2>&1 </dev/null 9>&- &
  fi
  local deadline=$((SECONDS + 60))
  until answers "$own_host"; do
    if ((SECONDS > deadline)); then
      log "dockerd did not answer within 60 s; the end of $logfile:"
      tail -n 30 "$logfile" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  lease
  report "$own_host" 1
}

stop() {
  local pid others
  if [[ -n $holder ]]; then
    rm -f "$leases/$holder"
    others=$(living_leases | tr '\n' ' ')
    if [[ -n $others ]]; then
      log "dockerd left running: still used by process(es) $others"
      return
    fi
    if [[ ! -e $state/for-holders ]]; then
      log "dockerd left running: it was not started for a lease holder"
      return
    fi
  fi
  if ! pid=$(our_pid); then
    log "no dockerd started by this script is running"
    return
  fi
  log "stopping dockerd $pid"
  kill -TERM "$pid"
  local deadline=$((SECONDS + 30))
  while [[ -d /proc/$pid ]]; do
    if ((SECONDS > deadline)); then
      log "dockerd $pid did not stop in 30 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
}

status() {
  local existing=${DOCKER_HOST:-unix:///var/run/docker.sock}
  if answers "$existing"; then
    report "$existing" 0
  elif answers "$own_host"; then
    report "$own_host" 0
  else
    log "no engine reachable"
    exit 1
  fi
}

# One caller at a time: two sessions starting at once would both start a dockerd on one
# data root; a stop between another's start and its lease would stop an engine in use.
mkdir -p "$state"
exec 9>"$state/lock"
flock 9

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
