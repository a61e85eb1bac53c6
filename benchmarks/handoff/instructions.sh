#!/bin/sh
# Instructions per contended handoff, by idiom, counted by callgrind (deterministic: unlike CPU time, code
# placement does not move it). Each idiom runs 20,000 and 60,000 iterations; the difference over 40,000
# cancels start-up and tear-down. Needs valgrind (Debian: valgrind).
#
#   benchmarks/handoff/instructions.sh [path/to/rein_handoff_count] [reactor 0|1]
set -eu
bin=${1:-build/bench/benchmarks/rein_handoff_count}
reactor=${2:-1}
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" "$reactor" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '| idiom (reactor %s) | instructions per iteration |\n|---|---:|\n' "$reactor"
for idiom in floor bare_semaphore single_thread_semaphore single_thread_semaphore_untimed \
    single_thread_semaphore_observed \
    single_thread_semaphore_coarse single_thread_semaphore_direct semaphore semaphore_untimed \
    semaphore_observed semaphore_coarse semaphore_direct \
    channel_async_send channel_try_send_then_async_send concurrent_channel_async_send \
    concurrent_channel_try_send_then_async_send throttle_uncontended throttle_contended; do
  a=$(count "$idiom" 20000)
  b=$(count "$idiom" 60000)
  printf '| %s | %s |\n' "$idiom" "$(( (b - a) / 40000 ))"
done
