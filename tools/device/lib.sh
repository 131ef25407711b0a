# Sourced by the device scripts (tools/device/*.sh), after OUT is set.

source tools/device/labs.sh  # lab_overlay

# The FlashMLA tree: $FLASHMLA_DIR (default .peer/flashmla), else .peer/flashmla.tar.xz (1.2 MB
# against 30: what the calls carry) unpacked to /tmp/flashmla.
FLASHMLA_DIR=${FLASHMLA_DIR:-.peer/flashmla}
if [ ! -f "$FLASHMLA_DIR/setup.py" ] && [ -f .peer/flashmla.tar.xz ]; then
  FLASHMLA_DIR=/tmp/flashmla/flashmla
  mkdir -p /tmp/flashmla && tar -C /tmp/flashmla -xJf .peer/flashmla.tar.xz
fi
# flashmla_build: FlashMLA built into $FLASHMLA_DIR in the background while the GPU runs other
# steps (its log: $OUT/flashmla_build.log). flashmla_built [LINES]: waits for that build (at
# once when none is pending) and copies the log's last LINES (default 1) into the summary.
flashmla_build() {
  bash tools/peers/build_flashmla.sh "$FLASHMLA_DIR" > "$OUT/flashmla_build.log" 2>&1 &
  FLASHMLA_BUILD=$!
}
flashmla_built() {
  [ -n "${FLASHMLA_BUILD:-}" ] || return 0
  wait "$FLASHMLA_BUILD"
  tail -"${1:-1}" "$OUT/flashmla_build.log" | tee -a "$OUT/summary.txt"
  FLASHMLA_BUILD=
}

# The kernels compiled ahead of time on the development machine (tools/device/warm_kernels.sh,
# run by stage.sh): unpacked once into a cache folder that vt-cuda reads (VT_CACHE_DIR), so a
# call spends no device time in NVRTC for them. A build whose texts or include paths differ
# from the warmed ones just compiles as before; the summary says how many modules were
# compiled here.
KCACHE=${KCACHE:-.dev/kcache.tar.xz}
if [ -f "$KCACHE" ] && [ -z "${VT_CACHE_DIR:-}" ]; then
  export VT_CACHE_DIR=/tmp/vt-kcache
  # Again when the archive is newer than the last unpack (a restaged call on a warm machine).
  if [ ! -f "$VT_CACHE_DIR/.stamp" ] || [ "$KCACHE" -nt "$VT_CACHE_DIR/.stamp" ]; then
    mkdir -p "$VT_CACHE_DIR" && tar -C "$VT_CACHE_DIR" --strip-components=1 -xJf "$KCACHE" \
      && touch -r "$KCACHE" "$VT_CACHE_DIR/.stamp"
  fi
  echo "kernel cache: $(ls "$VT_CACHE_DIR/cuda" | wc -l) modules warmed ahead ($KCACHE)" | tee -a "$OUT/summary.txt"
fi
# kcache_report: how many modules this call compiled itself (cache files newer than the
# archive); printed when the sourcing script exits.
kcache_report() {
  if [ -n "${VT_CACHE_DIR:-}" ] && [ -f "$KCACHE" ]; then
    echo "kernel cache: $(find "$VT_CACHE_DIR/cuda" -newer "$KCACHE" -type f | wc -l) modules compiled in this call" \
      | tee -a "$OUT/summary.txt"
  fi
}
trap kcache_report EXIT
# PREFLIGHT=1: the archive must hold the default build of the staged xtask's texts (a stale
# archive cost the thirty-eighth session's first call three decode-module compiles on the
# device, each past its step's cap). Warms a copy of it here and fails if anything compiled.
kcache_check() {
  local x=${BIN:-.dev/bin}/xtask tmp
  [ -f "$KCACHE" ] && [ -x "$x" ] || return 0
  tmp=$(mktemp -d)
  tar -C "$tmp" -xJf "$KCACHE"
  local log missed
  log=$(env -u VT_CUDA_KERNELS_DIR -u VT_CUDA_INCLUDE -u CUDA_HOME -u CUDA_PATH \
    "$x" kernels --warm-cache "$tmp/cache" --sm 90 2>&1)
  rm -rf "$tmp"
  missed=$(grep -c ", compiled (" <<< "$log")
  if ! grep -q ", already cached (" <<< "$log" && [ "$missed" -eq 0 ]; then
    echo "PREFLIGHT FAIL kcache: could not check (source .ci/kernels-cuda-deps): $(tail -n 1 <<< "$log")" | tee -a "$OUT/summary.txt"
  elif [ "$missed" -gt 0 ]; then
    echo "PREFLIGHT FAIL kcache: $missed module(s) of $x's default build are not in $KCACHE (re-run tools/device/warm_kernels.sh)" \
      | tee -a "$OUT/summary.txt"
  fi
}
if [ -n "${PREFLIGHT:-}" ]; then kcache_check; fi

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under a time cap into $OUT/NAME.log (a hang shows
# as rc 124 and the later steps still run), appends its exit status and the lines that matter
# (test results, failures, sanitizer summaries, the decode kernels' errors) to
# $OUT/summary.txt, and returns the exit status.
# With DEADLINE set (seconds since the script started), a step's cap shrinks to the time left
# and a step with under 10 s left is skipped (said in the summary), so the call ends itself and
# its EXIT trap still packs the logs before the device's own limit kills it.
step() {
  local name=$1 cap=$2
  shift 2
  local t0=$SECONDS
  if [ -n "${DEADLINE:-}" ]; then
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 10 ]; then
      echo "== $name: skipped (DEADLINE $DEADLINE s reached)" | tee -a "$OUT/summary.txt"
      return 124
    fi
    [ "$left" -lt "$cap" ] && cap=$left
  fi
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  grep -E "test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|hazard|out rel error .*wgmma_fp8r|wgmma_3wg" "$OUT/$name.log" \
    | tail -12 | tee -a "$OUT/summary.txt"
  if [ -n "${PREFLIGHT:-}" ]; then preflight_check "$name"; fi
  return $rc
}

# san NAME CAP TOOL BINARY TEST...: `step` of compute-sanitizer's TOOL over the named tests of the
# staged test binary $BIN/BINARY, one thread (RACE_ARGS: extra options, e.g. for racecheck).
san() {
  step "$1" "$2" compute-sanitizer --tool "$3" --error-exitcode 9 ${RACE_ARGS:+$RACE_ARGS} "$BIN/$4" --exact "${@:5}" \
    --test-threads 1
}

# PREFLIGHT=1 (tools/device/preflight.sh, on the development machine, no GPU): each step still
# runs (a GPU command fails or skips at once there), and its log is read for what would waste a
# device call: a command line the program rejects, an --only filter or a test filter that matches
# nothing.
preflight_check() {
  local log=$OUT/$1.log
  if grep -qE "^error: (unexpected argument|invalid value|unrecognized subcommand|the argument|a value is required)" "$log"; then
    echo "PREFLIGHT FAIL $1: command line rejected: $(grep -m1 -E '^error:' "$log")" | tee -a "$OUT/summary.txt"
  fi
  if grep -q "matches no shape" "$log"; then
    echo "PREFLIGHT FAIL $1: $(grep -m1 'matches no shape' "$log")" | tee -a "$OUT/summary.txt"
  fi
  if grep -q "^running 0 tests" "$log"; then
    echo "PREFLIGHT FAIL $1: no test matched" | tee -a "$OUT/summary.txt"
  fi
}

# The profile scripts' ncu run (sparse_profile.sh, decode_profile.sh): the full section set
# with source counters over the third launch of the kernels a regex matches, into
# $OUT/prof/NAME.ncu-rep. Use as "${NCU[@]}" -k regex:... --export "$OUT/prof/NAME" COMMAND.
NCU=(ncu --clock-control none --set full --import-source yes --launch-skip 2 --launch-count 1)
# ncu_pages NAME: the report's details page and SASS source counters as text
# ($OUT/prof/NAME_details.txt, NAME_source.csv), its key lines into the summary; the report is
# then removed (the text is what the call brings back).
ncu_pages() {
  local rep=$OUT/prof/$1.ncu-rep
  [ -f "$rep" ] || { echo "no report for $1" | tee -a "$OUT/summary.txt"; return; }
  ncu --import "$rep" --page details > "$OUT/prof/$1_details.txt" 2>&1
  ncu --import "$rep" --page source --csv --print-source sass > "$OUT/prof/$1_source.csv" 2>&1
  grep -E "^\s+(Duration|Elapsed Cycles|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Registers Per Thread|Grid Size|Cluster Size|Achieved Occupancy|Executed Instructions  )" \
    "$OUT/prof/$1_details.txt" | sed "s/^ */$1: /" | tee -a "$OUT/summary.txt"
  rm -f "$rep"
}

# link_manifest: the block's test binaries find their goldens through the crate path compiled
# in ($MANIFEST, the development checkout's crates/mla-block); where that path does not exist
# here it is made a link to this tree's crate (nothing without MANIFEST).
link_manifest() {
  if [ -n "${MANIFEST:-}" ] && [ ! -e "$MANIFEST" ]; then
    mkdir -p "$(dirname "$MANIFEST")" && ln -s "$PWD/crates/mla-block" "$MANIFEST" \
      || echo "could not link $MANIFEST: golden tests will skip" | tee -a "$OUT/summary.txt"
  fi
}
