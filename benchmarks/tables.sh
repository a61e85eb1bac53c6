#!/bin/sh
# The benchmark tables of docs/benchmarks.md that come straight from rein_benchmarks, regenerated from
# Google Benchmark's JSON output (--benchmark_format=json or --benchmark_out_format=json): the semaphore
# table, the throttle table and the keyed table. POSIX sh and awk only.
#
#   benchmarks/tables.sh [--update DOC] RESULT.json [RESULT.json ...]
#       the tables from runs already made; with several files each cell lists the runs as "run 1 / run 2"
#   benchmarks/tables.sh --run BINARY [--runs N] [--update DOC]
#       runs BINARY (build/bench/benchmarks/rein_benchmarks) N times (default 1) with the options the page
#       states, then the same
#
# Without --update the tables are printed. With it, each table replaces the lines of DOC between
# "<!-- generated table: NAME (benchmarks/tables.sh) -->" and "<!-- end of generated table -->"; the rest
# of DOC is left as it is. A cell is the median of the repetitions' CPU time per iteration (the "median"
# aggregate when the run has one, else the median of the iterations), in ns, and in brackets its multiple
# of the row's floor in the same run. A benchmark missing from a run leaves its cell empty.
set -eu

usage() {
  sed -n '6,10s/^# \{0,1\}//p' "$0" >&2
  exit 2
}

doc=
binary=
runs=1
while [ $# -gt 0 ]; do
  case $1 in
    --update) [ $# -ge 2 ] || usage; doc=$2; shift 2 ;;
    --run) [ $# -ge 2 ] || usage; binary=$2; shift 2 ;;
    --runs) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
    -h | --help) usage ;;
    -*) usage ;;
    *) break ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/rein-tables.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

if [ -n "$binary" ]; then
  [ $# -eq 0 ] || usage
  i=1
  while [ "$i" -le "$runs" ]; do
    echo "run $i of $runs: $binary" >&2
    "$binary" --benchmark_filter='^(uncontended|contended_64x4|throttle|keyed)/' \
      --benchmark_repetitions=10 --benchmark_min_time=0.2 --benchmark_enable_random_interleaving=true \
      --benchmark_report_aggregates_only=true \
      --benchmark_out="$work/run$i.json" --benchmark_out_format=json >/dev/null
    set -- "$@" "$work/run$i.json"
    i=$((i + 1))
  done
fi
[ $# -gt 0 ] || usage
for f in "$@"; do
  [ -r "$f" ] || { echo "tables.sh: cannot read $f" >&2; exit 1; }
done

awk -v out="$work" '
function unquote(s) {
  sub(/^[^:]*:[ \t]*/, "", s); sub(/,[ \t]*$/, "", s); gsub(/^"|"$/, "", s); return s
}
function flush() {
  if (name == "") return
  if (run_name == "") run_name = name
  scale = unit == "us" ? 1e3 : unit == "ms" ? 1e6 : unit == "s" ? 1e9 : 1
  if (run_type == "aggregate") {
    if (aggregate == "median") median[run, run_name] = cpu * scale
  } else if (run_type != "aggregate" && cpu != "") {
    k = ++count[run, run_name]; sample[run, run_name, k] = cpu * scale
  }
  name = run_name = run_type = aggregate = unit = cpu = ""
}
FNR == 1 { run++; in_list = 0 }
/"benchmarks"[ \t]*:/ { in_list = 1; next }
in_list && /^[ \t]*"name"[ \t]*:/ { flush(); name = unquote($0) }
in_list && /^[ \t]*"run_name"[ \t]*:/ { run_name = unquote($0) }
in_list && /^[ \t]*"run_type"[ \t]*:/ { run_type = unquote($0) }
in_list && /^[ \t]*"aggregate_name"[ \t]*:/ { aggregate = unquote($0) }
in_list && /^[ \t]*"cpu_time"[ \t]*:/ { cpu = unquote($0) + 0 }
in_list && /^[ \t]*"time_unit"[ \t]*:/ { unit = unquote($0) }
in_list && /^[ \t]*}/ { flush() }

# The value of benchmark b in run r, or "" when that run does not have it.
function value(r, b,   n, i, j, t, v) {
  if ((r, b) in median) return median[r, b]
  n = count[r, b] + 0
  if (n == 0) return ""
  for (i = 1; i <= n; i++) v[i] = sample[r, b, i]
  for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function thousands(s,   head) {
  head = ""
  while (length(s) > 3) { head = "," substr(s, length(s) - 2) head; s = substr(s, 1, length(s) - 3) }
  return s head
}
function ns(v) {
  if (v >= 100) return thousands(sprintf("%.0f", v))
  return v >= 10 ? sprintf("%.1f", v) : sprintf("%.2f", v)
}
# One cell: benchmark b in every run, each with its multiple of floor f ("" for none).
function cell(b, f,   r, v, fv, s, text) {
  s = ""; text = 0
  for (r = 1; r <= run; r++) {
    v = value(r, b)
    if (v == "") { s = s (r > 1 ? " / " : "") "-"; continue }
    text = 1
    s = s (r > 1 ? " / " : "") ns(v)
    if (f != "") { fv = value(r, f); if (fv != "" && fv > 0) s = s sprintf(" (%.2f)", v / fv) }
  }
  return text ? s : ""
}
function runs_label() { return run > 1 ? ", run 1 / run " run : "" }

function emit(s) {
  while (sub(/\|  \|/, "| |", s)) {}
  print s > file
}
function semaphore_row(label, idiom,   u_on, u_off, c_off, c_on) {
  u_on = "uncontended/reactor_on/"; u_off = "uncontended/reactor_off/"
  c_off = "contended_64x4/reactor_off/"; c_on = "contended_64x4/reactor_on/"
  emit(sprintf("| %s | %s | %s | %s | %s |", label,
    cell(u_on idiom, u_on "floor_nested_awaitable"), cell(u_off idiom, u_off "floor_nested_awaitable"),
    cell(c_off idiom, c_off "floor_post"), cell(c_on idiom, c_on "floor_post")))
}
function throttle_row(label, door, n,   p, floor) {
  p = "throttle/" door "/" n "_stages/"
  floor = p (door == "acquire" ? "floor_stage_acquire_sum" : "floor_stage_try_acquire_sum")
  emit(sprintf("| %s | %s | %s | %s | %s |", label, cell(p "floor_stage_try_acquire_sum", ""),
    cell(p "floor_stage_acquire_sum", ""), cell(p "idiom_by_hand", ""), cell(p "rein_throttle", floor)))
}
function keyed_row(label, p, floor) {
  emit(sprintf("| %s | %s | %s | %s | %s |", label, cell(p floor, ""), cell(p "idiom_mutex_map_shared_ptr", ""),
    cell(p "rein_keyed", ""), cell(p "rein_keyed_by_view", "")))
}
END {
  flush()
  file = out "/semaphore.md"
  print "| idiom" runs_label() " | uncontended, reactor on | uncontended, reactor off | 64 coroutines / 4 permits, reactor off | same, reactor on |" > file
  print "|---|---:|---:|---:|---:|" > file
  semaphore_row("floor: nested awaitable", "floor_nested_awaitable")
  semaphore_row("floor: `co_await post`", "floor_post")
  semaphore_row("floor: bare semaphore (a count and a ring of parked handlers, nothing else)", "floor_bare_semaphore")
  semaphore_row("`rein::single_thread_semaphore`", "rein_single_thread_semaphore")
  semaphore_row("`rein::semaphore` (thread-safe)", "rein_semaphore")
  semaphore_row("`rein::single_thread_semaphore`, `measure_wait = false`", "rein_single_thread_semaphore_untimed")
  semaphore_row("`rein::semaphore`, `measure_wait = false`", "rein_semaphore_untimed")
  semaphore_row("channel: try_send, then async_send", "channel_try_send_then_async_send")
  semaphore_row("channel: async_send only", "channel_async_send")
  semaphore_row("concurrent_channel: try_send, then async_send", "concurrent_channel_try_send_then_async_send")
  semaphore_row("concurrent_channel: async_send only", "concurrent_channel_async_send")
  semaphore_row("steady_timer + cancel_one", "steady_timer_cancel_one")
  close(file)

  file = out "/throttle.md"
  print "| `+ complete(success)`, stages" runs_label() " | floor: stages\047 `try_acquire` | floor: stages\047 `co_await acquire()` | idiom: by hand | `rein::throttle` |" > file
  print "|---|---:|---:|---:|---:|" > file
  throttle_row("`try_acquire`, 2: keyed semaphore, token bucket", "try_acquire", 2)
  throttle_row("`try_acquire`, 4: keyed quota gate, keyed semaphore, global semaphore, token bucket", "try_acquire", 4)
  throttle_row("`co_await acquire`, 2", "acquire", 2)
  throttle_row("`co_await acquire`, 4", "acquire", 4)
  close(file)

  file = out "/keyed.md"
  print "| `get(key)`" runs_label() " | floor | idiom | `rein::keyed` | `rein::keyed`, by `string_view` |" > file
  print "|---|---:|---:|---:|---:|" > file
  keyed_row("hit, 10 keys", "keyed/get_hit/10_keys/", "floor_unordered_map_find")
  keyed_row("hit, 10,000 keys", "keyed/get_hit/10000_keys/", "floor_unordered_map_find")
  keyed_row("hit, 1,000,000 keys", "keyed/get_hit/1000000_keys/", "floor_unordered_map_find")
  keyed_row("new key, steady state (1 limiter made per get; the floor is making one `semaphore`)",
            "keyed/get_new_key/", "floor_make_semaphore")
  close(file)
}
' "$@"

if [ -z "$doc" ]; then
  for table in semaphore throttle keyed; do
    printf '%s\n' "<!-- generated table: $table (benchmarks/tables.sh) -->"
    cat "$work/$table.md"
    printf '%s\n\n' "<!-- end of generated table -->"
  done
  exit 0
fi

awk -v dir="$work" '
/^<!-- generated table: [a-z]+ \(benchmarks\/tables\.sh\) -->$/ {
  print
  table = $4
  file = dir "/" table ".md"
  while ((getline line < file) > 0) print line
  close(file)
  skipping = 1
  replaced[table] = 1
  next
}
/^<!-- end of generated table -->$/ { skipping = 0 }
!skipping { print }
END {
  if (skipping) { print "tables.sh: a generated table is not closed" > "/dev/stderr"; exit 1 }
  if (!("semaphore" in replaced) || !("throttle" in replaced) || !("keyed" in replaced)) {
    print "tables.sh: the page lacks a marker for one of the tables (semaphore, throttle, keyed)" > "/dev/stderr"
    exit 1
  }
}
' "$doc" >"$work/doc.md"
cat "$work/doc.md" >"$doc"
echo "tables.sh: updated $doc" >&2
