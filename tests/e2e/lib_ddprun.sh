# Helpers sourced by the ddprun_*.sh e2e tests. usage: . lib_ddprun.sh DDPRUN PROBE
set -uo pipefail
DDPRUN=$1 PROBE=$2
WORK=$(mktemp -d)
# A word on every probe's command line, unique to this test run: pgrep finds
# exactly our processes even when other runs share the machine.
MARKER="ddprun_e2e_$$_${RANDOM}"
cleanup() {
  pgrep -f "$MARKER" | xargs -r kill -KILL 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (last 30 lines)" >&2; tail -30 "$f" >&2; }; done
  exit 1
}
now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# at_most VALUE LIMIT: VALUE <= LIMIT (decimals)
at_most() { awk -v v="$1" -v l="$2" 'BEGIN { exit !(v + 0 <= l + 0) }'; }
. "$(dirname "${BASH_SOURCE[0]}")/lib_ports.sh"
# wait_for_lines FILE PATTERN COUNT [SECONDS]: until FILE has COUNT lines matching PATTERN.
wait_for_lines() {
  local deadline=$((SECONDS + ${4:-20}))
  local n
  while n=$(grep -cE -- "$2" "$1" 2>/dev/null); [ "${n:-0}" -lt "$3" ]; do
    [ $SECONDS -ge $deadline ] && fail "timed out waiting for $3 lines /$2/ in $1"
    sleep 0.05
  done
}
# no_process_left SECONDS: every process carrying the marker is gone within SECONDS.
no_process_left() {
  local deadline
  deadline=$(awk -v n="$(now)" -v s="$1" 'BEGIN { print n + s }')
  while pgrep -f "$MARKER" >/dev/null; do
    if ! at_most "$(now)" "$deadline"; then
      local left
      # Gone between the loop's look and this one (seen under ASan): none left.
      left=$(pgrep -d, -f "$MARKER") || return 0
      ps -o pid,ppid,pgid,stat,args -p "$left" >&2
      fail "processes left after ${1} s"
    fi
    sleep 0.05
  done
}
# The pid a probe of RANK printed ("[rank R] pid=N").
rank_pid() { sed -n "s/^\[rank $2\] pid=\([0-9]*\)$/\1/p" "$1" | head -1; }
