# Sourced by scripts/bench-*: their common options and output.
#   --smoke   the smallest size, no timing claim: scripts/test runs every benchmark this way so a
#             broken benchmark fails CI
#   --json    one JSON object (benchmark, commit, cores, load, runs, rows, medians) instead of
#             the table
#   --runs N  run the whole benchmark N times (default 1): every run's rows are printed (column
#             `rep`: 1..N), then one `median` row per size: each column's median over the runs.
#             A ratio is taken within one run (both sides measured in the same invocation), and
#             its median is the median of those ratios.
# Each benchmark defines `bench_once`, which writes a table on stdout (a line of column names,
# then one line per size, values separated by blanks), and calls `bench_main NAME KEY...`
# (KEY: the columns that name a size). The table is printed under a header naming the commit,
# the machine's cores and its load average at the start and the end (figures from a busy
# machine are not comparable), or turned into JSON.

BENCH_SMOKE=0
BENCH_JSON=0
BENCH_RUNS=1
BENCH_ARGS=()

bench_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --smoke) BENCH_SMOKE=1 ;;
      --json) BENCH_JSON=1 ;;
      --runs) [ $# -ge 2 ] || { echo "$(basename "$0"): --runs needs a number" >&2; exit 2; }
              BENCH_RUNS=$2; shift ;;
      --runs=*) BENCH_RUNS=${1#--runs=} ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
      *) BENCH_ARGS+=("$1") ;;
    esac
    shift
  done
  case "$BENCH_RUNS" in
    ''|*[!0-9]*|0) echo "$(basename "$0"): --runs: a whole number of runs, at least 1 (got '$BENCH_RUNS')" >&2; exit 2 ;;
  esac
}

# bench_main NAME KEY...: runs bench_once BENCH_RUNS times and prints the result.
bench_main() {
  local name=$1 load0 r
  shift
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  {
    for r in $(seq 1 "$BENCH_RUNS"); do
      [ "$BENCH_RUNS" = 1 ] || echo "$name: run $r of $BENCH_RUNS" >&2
      echo "#run $r"
      bench_once
    done
  } | BENCH_LOAD0=$load0 bench_emit "$name" "$@"
}

# bench_emit NAME KEY... < runs (each "#run K" then a table)
bench_emit() {
  local name=$1 commit
  shift
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if ! git diff --quiet HEAD 2>/dev/null; then commit="$commit+changes"; fi
  BENCH_JSON=$BENCH_JSON BENCH_NAME=$name BENCH_COMMIT=$commit BENCH_CORES=$(nproc) \
    BENCH_LOAD0=${BENCH_LOAD0:-$(cut -d' ' -f1-3 /proc/loadavg)} BENCH_KEYS="$*" BENCH_RUNS=$BENCH_RUNS \
    BENCH_MODE=$([ "$BENCH_SMOKE" = 1 ] && echo smoke || echo full) \
    python3 -c '
import json, os, statistics, sys
env = os.environ
cols, rows, rep = None, [], None
for line in sys.stdin.read().splitlines():
    w = line.split()
    if not w:
        continue
    if w[0] == "#run":
        rep, header = int(w[1]), True
        continue
    if rep is None:
        sys.exit("bench: the benchmark printed no run marker")
    if header:
        header = False
        if cols is None:
            cols = w
        elif w != cols:
            sys.exit("bench: run %d printed columns %r, not %r" % (rep, w, cols))
        continue
    if len(w) != len(cols):
        sys.exit("bench: row %r does not match columns %r" % (w, cols))
    rows.append([str(rep)] + w)
if cols is None:
    sys.exit("bench: the benchmark printed no table")
if not rows:
    sys.exit("bench: the benchmark printed no row")
# The load when the last run ended (the shell read it when the pipe started).
end_load = open("/proc/loadavg").read().split()[:3]
runs = int(env["BENCH_RUNS"])
done = sorted({r[0] for r in rows}, key=int)
if len(done) != runs:
    sys.exit("bench: %d runs asked, %d printed rows" % (runs, len(done)))
keys = env["BENCH_KEYS"].split()
for k in keys:
    if k not in cols:
        sys.exit("bench: key column %r not in %r" % (k, cols))
def num(v):
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return None
# One median row per size (the key columns), in the order the sizes first appeared.
ki = [cols.index(k) + 1 for k in keys]
groups = {}
for r in rows:
    groups.setdefault(tuple(r[i] for i in ki), []).append(r)
medians = []
for key, rs in groups.items():
    m = ["median"]
    for i in range(1, len(cols) + 1):
        vals = [r[i] for r in rs]
        if i in ki:
            m.append(vals[0])
            continue
        nums = [num(v) for v in vals]
        if all(n is not None for n in nums):
            med = statistics.median(nums)
            decimals = max((len(v.split(".")[1]) if "." in v else 0) for v in vals)
            m.append(("%.*f" % (decimals, med)) if decimals or med != int(med) else str(int(med)))
        elif len(set(vals)) == 1:
            m.append(vals[0])
        else:
            m.append("-")
    medians.append(m)
allcols = ["rep"] + cols
table = rows + (medians if runs > 1 else [])
def obj(r):
    return {c: (num(v) if num(v) is not None else v) for c, v in zip(allcols, r)}
meta = {"benchmark": env["BENCH_NAME"], "mode": env["BENCH_MODE"], "commit": env["BENCH_COMMIT"],
        "cores": int(env["BENCH_CORES"]),
        "load": [float(x) for x in end_load],
        "load_at_start": [float(x) for x in env["BENCH_LOAD0"].split()],
        "runs": runs}
if env.get("BENCH_JSON") == "1":
    meta["rows"] = [obj(r) for r in rows]
    meta["medians"] = [obj(r) for r in medians]
    print(json.dumps(meta, indent=2))
else:
    print("# %s (%s): commit %s, %d cores, load average %s at the start, %s at the end, %d run%s" % (
          meta["benchmark"], meta["mode"], meta["commit"], meta["cores"],
          " ".join(env["BENCH_LOAD0"].split()), " ".join(end_load),
          runs, "" if runs == 1 else "s (then the median of each column per size)"))
    widths = [max(len(c), *(len(str(r[i])) for r in table)) for i, c in enumerate(allcols)]
    for r in [allcols] + table:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))
'
}
