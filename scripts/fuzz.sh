#!/usr/bin/env bash
# The cargo-fuzz targets of fuzz/ (README, "Fuzzing"; figures in docs/benchmarks.md, "Fuzzing"):
#   objects      Services, EndpointSlices and Nodes as JSON through the index, the planner, the
#                tables and the renderer; every new script must pass `nft -c`
#   annotations  the address-types and -CIDRs, published-addresses and node-selector parsers
#   readback     the netlink read-back parser on arbitrary bytes
#
#   scripts/fuzz.sh [--duration SECONDS] [--build-only] [TARGET...]
#
# Installs what it needs when missing: rustup's nightly toolchain (minimal profile) and
# cargo-fuzz (pinned below) into ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/cargo-fuzz. Builds the
# targets (release, with debug assertions and AddressSanitizer, into fuzz/target), then runs
# each for SECONDS (default 60) inside a network namespace of its own (`unshare --net`: `nft
# -c` checks against an empty ruleset there, never the machine's), starting from the seeds in
# fuzz/corpus/<target> and a scratch corpus outside the repository, which is deleted after.
# Prints one line a target:
#   fuzz <target> seconds=S execs=N execs_per_s=R cov=C features=F corpus=K crashes=0
# A crash, an `nft -c` rejection, a leak or a timeout fails the script, the input kept in
# fuzz/artifacts/<target>/ (a regression test is due: see fuzz/README). Needs root for unshare.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_FUZZ_VERSION=0.13.2
duration=60
build_only=false
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --build-only) build_only=true; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(objects annotations readback)

# fuzz/ is a workspace of its own, with its own target directory.
unset CARGO_TARGET_DIR
cache="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
fuzz_root="$cache/cargo-fuzz"
if ! "$fuzz_root/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
  cargo install --locked --root "$fuzz_root" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
export PATH="$fuzz_root/bin:$PATH"

cd fuzz
start=$SECONDS
for t in "${targets[@]}"; do
  cargo +nightly fuzz build -O "$t" >&2
done
for t in "${targets[@]}"; do
  [ -x "target/x86_64-unknown-linux-gnu/release/$t" ] || { echo "fuzz: $t did not build" >&2; exit 1; }
done
echo "fuzz: built in $((SECONDS - start)) s" >&2
$build_only && exit 0

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "artifacts/$t"
  log="$scratch/$t.log"
  status=0
  # -timeout: an input that takes 10 s is a finding (an endless loop, or an explosion).
  unshare --net -- cargo +nightly fuzz run -O "$t" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$duration" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" >"$log" 2>&1 || status=$?
  stat() { awk -v k="stat::$1:" '$1 == k {print $2}' "$log" | tail -1; }
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")"
  corp="$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$done_line")"
  execs="$(stat number_of_executed_units)"
  crashes="$(find "artifacts/$t" -type f | wc -l)"
  echo "fuzz $t seconds=$duration execs=${execs:-0} execs_per_s=$(( ${execs:-0} / duration )) cov=${cov:-?} features=${ft:-?} corpus=${corp:-?} crashes=$crashes"
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "fuzz: $t failed (exit $status); its input is in fuzz/artifacts/$t/; the end of its log:" >&2
    tail -40 "$log" >&2
    failed=1
  fi
done
exit "$failed"
