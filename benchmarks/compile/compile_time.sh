#!/bin/bash
# CPU seconds (user + system) to compile each probe of benchmarks/compile/, the median of several runs, and
# its multiple of Asio's header alone and of the timed-wait floor:
#
#   asio_only.cpp         #include <boost/asio.hpp>, nothing else
#   timed_wait_floor.cpp  the least Asio a coroutine awaiting a timed wait instantiates
#   semaphore.cpp         a coroutine awaiting one rein::semaphore (each probe includes only what it needs)
#   channel_idiom.cpp     the same with Asio's idiom instead: a concurrent channel used as a semaphore
#   throttle4.cpp         a coroutine using a four-stage throttle
#   throttle4_idiom.cpp   the same four stages written with Asio alone (maps, channels, timer waits)
#   semaphore_separate, throttle4_separate
#                         semaphore.cpp and throttle4.cpp with REIN_SEPARATE_COMPILATION defined
#   impl_src.cpp          with it too: the one unit that compiles what those two leave out
#
# and, last, each rein probe's multiple of its Asio idiom.
#
#   benchmarks/compile/compile_time.sh [compiler, default g++] [runs, default 5] [flags, default "-O2 -DNDEBUG"]
# Run from the repository's root, with nothing else running (compile times move with the machine's load).
# Needs bash 4 (an associative array). A probe that fails to compile stops the script with its messages.
set -euo pipefail
export LC_ALL=C  # bash's `time` prints the locale's decimal point, which awk would misread
cxx=${1:-g++}
runs=${2:-5}
if ((runs < 1)); then
  echo "compile_time.sh: runs must be at least 1, got $runs" >&2
  exit 2
fi
flags=${3:--O2 -DNDEBUG}
dir=$(dirname "$0")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cpu_seconds() {  # one compile's user + system seconds
  local TIMEFORMAT='%U %S' source=$1 extra=""
  case $1 in
    *_separate) source=${1%_separate} extra=-DREIN_SEPARATE_COMPILATION ;;
    impl_src) extra=-DREIN_SEPARATE_COMPILATION ;;
  esac
  # shellcheck disable=SC2086
  if ! { time "$cxx" -std=c++20 $flags $extra -Iinclude -c "$dir/$source.cpp" -o "$out/$1.o" 2> "$out/$1.log"; } \
      2> "$out/time"; then
    cat "$out/$1.log" >&2
    exit 1
  fi
  awk '{print $1 + $2}' "$out/time"
}

median() {  # of the runs of one probe, interleaved with the others' runs
  sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

probes="asio_only timed_wait_floor semaphore semaphore_separate channel_idiom throttle4 throttle4_separate
  throttle4_idiom impl_src"
for ((i = 0; i < runs; ++i)); do
  for p in $probes; do cpu_seconds "$p" >> "$out/$p.times"; done
done
declare -A m
for p in $probes; do m[$p]=$(median < "$out/$p.times"); done
printf '| probe (%s %s, median of %s) | CPU s | / asio_only | / timed_wait_floor |\n|---|---:|---:|---:|\n' \
  "$cxx" "$flags" "$runs"
for p in $probes; do
  awk -v p="$p" -v t="${m[$p]}" -v a="${m[asio_only]}" -v f="${m[timed_wait_floor]}" \
    'BEGIN {printf "| %s | %.2f | %.2f | %.2f |\n", p, t, t / a, t / f}'
done
echo  # a blank line ends the table
for pair in semaphore:channel_idiom semaphore_separate:channel_idiom throttle4:throttle4_idiom \
    throttle4_separate:throttle4_idiom; do
  awk -v r="${pair%%:*}" -v i="${pair##*:}" -v t="${m[${pair%%:*}]}" -v u="${m[${pair##*:}]}" \
    'BEGIN {printf "%s / %s: %.2f\n", r, i, t / u}'
done
