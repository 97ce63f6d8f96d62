# Shared by train_elastic.sh and train_elastic_nnodes.sh (docs/elastic.md); the
# caller defines fail.

# The step membership $2 went on from, as the ranks print it in $1 (world size
# $3, a pattern; any by default), waiting up to 10 s for it; "" when it never came.
went_on_from() {
  local step="" size=${3:-[0-9]*}
  for _ in $(seq 500); do
    step=$(grep -o "membership $2 is ranks [0-9,]* (launch ranks); this rank is now rank [0-9]* of $size; going on from step [0-9]*" "$1" |
      head -1 | grep -o "[0-9]*$")
    [ -n "$step" ] && break
    sleep 0.02
  done
  echo "$step"
}

# Every (epoch, step) of a --loss-log once, steps 1.. in order in every epoch.
check_loss_log() {
  awk -v f="$1" '
    { key = $1 " " $2; if (seen[key]++) { print f ": row " key " twice"; bad = 1 }
      if ($1 != e) { e = $1; want = 1 }
      if ($2 != want) { print f ": epoch " $1 " step " $2 " where " want " was due"; bad = 1 }
      want = $2 + 1 }
    END { exit bad }' "$1" || fail "the --loss-log $1 is not one row per step"
}

# The pid of the train process of launch rank $2 in the run writing $1.st.
rank_pid() {
  local p
  for p in $(pgrep -f -- "--save $1.st"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = train ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
