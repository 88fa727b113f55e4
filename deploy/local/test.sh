#!/usr/bin/env bash
# `make test`: everything CI runs. Lints, unit tests, then the integration tests against a
# real control plane this script starts on 127.0.0.1 (and always stops). Prints a
# "N passed, N failed" summary line.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1
here="$root/deploy/local"
# shellcheck source=build-times.sh
. "$here/build-times.sh"

t0=$(date +%s)
# Each step says when it starts (seconds since make test began) and how long the one before
# it took: where the time goes, in CI's log.
t_step=$t0
# How busy the two cores were during a step (from /proc/stat): what may still overlap.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
read -r busy_step total_step < <(cpu_ticks)
step() {
  local now busy total; now=$(date +%s)
  read -r busy total < <(cpu_ticks)
  printf '\n==> [%ss, previous step %ss, CPU %s%% busy] %s\n' "$(( now - t0 ))" "$(( now - t_step ))" \
    "$(( (busy - busy_step) * 100 / (total - total_step > 0 ? total - total_step : 1) ))" "$*"
  t_step=$now busy_step=$busy total_step=$total
}
out="$(mktemp -d)"
cluster="$(mktemp -d "${TMPDIR:-/tmp}/address-controller-test.XXXXXX")"
# Work whose answer is needed only at the end runs in the background, in a session of its
# own whose autogroup is at nice 19 (the control plane runs in sessions of its own too, and
# between sessions the kernel shares the CPU by autogroup): it takes only the cycles the
# tests and the control plane leave idle. `background NAME CMD...` starts one, `finish NAME`
# waits for it, prints its log and records a failure.
declare -A background_pids=()
background() {
  local name=$1; shift
  setsid -w bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' "$name" "$@" \
    >"$out/$name.log" 2>&1 &
  background_pids[$name]=$!
}
background_failed=()
finish() {
  local name=$1 rc=0
  wait "${background_pids[$name]}" || rc=$?
  unset "background_pids[$name]"
  cat "$out/$name.log"
  if [ "$rc" -ne 0 ]; then
    background_failed+=("$name")
    printf '\nmake test: %s FAILED (status %s; its log is above)\n' "$name" "$rc"
  fi
}
cleanup() {
  local pid
  for pid in "${background_pids[@]}"; do kill -- "-$pid" 2>/dev/null; done
  "$here/cluster.sh" down "$cluster" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT

fail() { printf '\nmake test: FAILED at step "%s"\n' "$1"; exit 1; }

step "rustfmt"
cargo fmt --all -- --check || fail "rustfmt (run cargo fmt)"

step "scripts: shellcheck and ruff (deploy/local/lint.sh)"
"$here/lint.sh" || fail "shellcheck / ruff (deploy/local/lint.sh)"

step "control-plane binaries (cached by version; cold build ~$COLD_GO_BINARIES_MIN min)"
# Started in the background: the Rust build and the Go build share the two cores.
"$here/build-binaries.sh" >"$out/build-binaries.log" 2>&1 &
build_pid=$!

step "clippy and cargo doc (no broken intra-doc link), in the background"
# Their own target directory (check builds share nothing with the test build); ~3 min of
# both cores, on the cycles the tests leave idle; their verdict is given before the results.
background lint env CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/lint" \
  RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links" \
  bash -c 'cargo clippy -q --workspace --all-targets -- -D warnings && cargo doc -q --no-deps --workspace'

step "build tests"
{ cargo build --workspace --bins && cargo test --workspace --no-run; } || fail "cargo build"

step "the function-length rule (no product function over 100 lines, no test over 150)"
# The binary the step before built (`cargo run -p` alone would rebuild shared dependencies
# with that one package's features: ~50 s).
"${CARGO_TARGET_DIR:-$root/target}/debug/fn-length" || fail "fn-length (split the function or test it names)"

step "the container image (release binaries; make image), in the background"
# ~7 min of both cores alone: it runs beside the cluster's start, the canary and the first
# tests. The tests that use it (image.rs, the node tier) run `build.sh` themselves: cargo's
# lock on target/image makes them wait for this build, then reuse it.
background image "$root/deploy/image/build.sh" --out "$out/image"

step "wait for control-plane binaries"
if ! wait "$build_pid"; then cat "$out/build-binaries.log"; fail "build-binaries"; fi
cat "$out/build-binaries.log"

step "start the local control plane in $cluster"
"$here/cluster.sh" up "$cluster" --watch-pid $$ || fail "cluster up"

step "canary: unit tests and one integration test, fail-fast"
# A broken build, a broken unit or a control plane the tests cannot use fails here in a
# minute or two, with its own message — not after the whole suite has run into its waits.
export ADDRESS_CONTROLLER_TEST_CLUSTER="$cluster"
canary_test=static_binding_costs_four_writes_and_converges_to_zero_also_after_restart
if ! timeout --kill-after=30 600 cargo test --workspace --lib --bins 2>&1 | tail -n 40; then
  fail "canary: unit tests"
fi
# `--workspace`, not `-p`: one package alone would resolve shared dependencies with its own
# features and build them again.
if ! timeout --kill-after=30 600 cargo test -q --workspace --test controller -- --exact "$canary_test" 2>&1 | tail -n 60; then
  fail "canary: the integration test controller::$canary_test"
fi

step "cargo test (unit + integration; the node tier too when root)"
if [ "$(id -u)" = 0 ]; then
  printf 'the node tier (tests/tests/node.rs, wire.rs, nodes.rs) runs: real kubelet nodes (one, then two), in the network namespaces address-controller-node[-2]\n'
else
  printf 'the node tier is skipped: it needs root (its tests are reported ignored, counted as skipped below)\n'
fi
rm -f "$root/target/node-figures.txt"
export ADDRESS_CONTROLLER_TEST_CLUSTER="$cluster"
# An overall deadline (AC_TEST_DEADLINE seconds from the start of make test; default 80 min,
# inside CI's 90): a hung test, or a regression that sends every test to its longest wait,
# fails here with the tests still running named, and CI has the time to print it.
deadline=$(( t0 + ${AC_TEST_DEADLINE:-4800} ))
left=$(( deadline - $(date +%s) ))
if [ "$left" -lt 60 ]; then left=60; fi
printf 'the tests have %ss (make test'"'"'s deadline: AC_TEST_DEADLINE=%ss)\n' "$left" "${AC_TEST_DEADLINE:-4800}"
timeout --kill-after=60 "$left" cargo test --workspace --no-fail-fast 2>&1 | tee "$out/cargo-test.log"
status=${PIPESTATUS[0]}
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  printf '\nmake test: DEADLINE — the tests ran past %ss of make test (AC_TEST_DEADLINE); still running when stopped:\n' "${AC_TEST_DEADLINE:-4800}"
  # libtest names a test it waits on ("has been running for over 60 seconds") and the
  # binary it runs ("Running tests/x.rs"); the last of each is what hung.
  grep -E '^ *Running |has been running for over' "$out/cargo-test.log" | tail -5 | sed 's/^/  /'
fi

step "wait for the background work: clippy and cargo doc, the container image"
finish lint
finish image

step "results"
passed=$(grep -Eo 'test result: .* ([0-9]+) passed' "$out/cargo-test.log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$out/cargo-test.log" | awk '{s+=$1} END {print s+0}')
ignored=$(grep -Eo '[0-9]+ ignored;' "$out/cargo-test.log" | awk '{s+=$1} END {print s+0}')
if [ -s "$root/target/node-figures.txt" ]; then
  printf '\nthe node tier'"'"'s figures:\n'; sed 's/^/  /' "$root/target/node-figures.txt"
fi
# What each failed test said, last, where a reader of only the end of the log sees it: the
# test's name, its panic's place and message (a backtrace and the captured output are above).
if grep -q '^---- .* stdout ----$' "$out/cargo-test.log"; then
  printf '\nwhy the failed tests failed (the first lines of each panic; the whole output is above):\n'
  awk '/^---- .* stdout ----$/ { name=$2; n=0; last=""; next }
       name != "" && /panicked at/ { if (last != "") printf "  %s: (last printed) %s\n", name, substr(last, 1, 200)
                                     printf "  %s: %s\n", name, $0; n=1; next }
       name != "" && n == 0 && NF > 0 { last=$0; next }
       n > 0 && n <= 4 && NF > 0 && !/^(Stack backtrace|note:|   *[0-9]+:)/ { printf "  %s:   %s\n", name, substr($0, 1, 400); n++; next }
       n > 4 || /^(Stack backtrace|note:)/ { name=""; n=0 }' "$out/cargo-test.log"
fi
printf '\nmake test finished in %ss\n' "$(( $(date +%s) - t0 ))"
printf '%s passed, %s failed, %s skipped\n' "$passed" "$failed" "$ignored"
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  printf 'make test: FAILED — stopped at its deadline (AC_TEST_DEADLINE=%ss); the counts above are of the tests that finished\n' "${AC_TEST_DEADLINE:-4800}"
fi
if [ "${#background_failed[@]}" -gt 0 ]; then
  printf 'make test: FAILED in the background: %s (its log is above the results)\n' "${background_failed[*]}"
  if [ "$status" -eq 0 ]; then status=1; fi
fi
if [ "$status" -ne 0 ]; then
  rm -rf "$root/target/test-cluster-logs"
  cp -r "$cluster/logs" "$root/target/test-cluster-logs" 2>/dev/null &&
    printf 'control-plane logs copied to target/test-cluster-logs\n'
  exit "$status"
fi
