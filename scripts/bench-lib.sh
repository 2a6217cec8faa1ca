# Sourced by scripts/bench-*: their common options and output.
#   --smoke  the smallest size, no timing claim: scripts/test runs every benchmark this way so a
#            broken benchmark fails CI
#   --json   one JSON object (benchmark, commit, cores, load, date, rows) instead of the table
# Each benchmark writes a table on stdout: a line of column names, then one line per size,
# values separated by blanks. bench_emit prints it under a header naming the commit, the
# machine's cores and its load average (figures from a busy machine are not comparable), or
# turns it into JSON.

BENCH_SMOKE=0
BENCH_JSON=0
BENCH_ARGS=()

bench_args() {
  local a
  for a in "$@"; do
    case "$a" in
      --smoke) BENCH_SMOKE=1 ;;
      --json) BENCH_JSON=1 ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
      *) BENCH_ARGS+=("$a") ;;
    esac
  done
}

# bench_emit NAME < table
bench_emit() {
  local name=$1 commit load
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if ! git diff --quiet HEAD 2>/dev/null; then commit="$commit+changes"; fi
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  BENCH_JSON=$BENCH_JSON BENCH_NAME=$name BENCH_COMMIT=$commit BENCH_LOAD=$load BENCH_CORES=$(nproc) \
    BENCH_MODE=$([ "$BENCH_SMOKE" = 1 ] && echo smoke || echo full) \
    python3 -c '
import json, os, sys
lines = [l.split() for l in sys.stdin.read().splitlines() if l.strip()]
if not lines:
    sys.exit("bench: the benchmark printed no table")
cols, rows = lines[0], lines[1:]
if not rows:
    sys.exit("bench: the benchmark printed no row")
def num(v):
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v
out = []
for r in rows:
    if len(r) != len(cols):
        sys.exit("bench: row %r does not match columns %r" % (r, cols))
    out.append(dict(zip(cols, map(num, r))))
env = os.environ
meta = {"benchmark": env["BENCH_NAME"], "mode": env["BENCH_MODE"], "commit": env["BENCH_COMMIT"],
        "cores": int(env["BENCH_CORES"]), "load": [float(x) for x in env["BENCH_LOAD"].split()]}
if os.environ.get("BENCH_JSON") == "1":
    meta["rows"] = out
    print(json.dumps(meta, indent=2))
else:
    print("# %s (%s): commit %s, %d cores, load average %s" % (meta["benchmark"], meta["mode"],
          meta["commit"], meta["cores"], " ".join(env["BENCH_LOAD"].split())))
    widths = [max(len(c), *(len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    for r in [cols] + rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))
'
}
