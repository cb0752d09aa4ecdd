#!/usr/bin/env bash
# The S3 store's suites on a real distributed S3 engine: a three-node Garage cluster on
# loopback (replication factor 3, consistent mode), then again with one node killed mid-run.
#
#   cargo install garage@2.5.0 --locked     # once, about 15-40 minutes
#   bash scripts/garage-cluster.sh
#
# Runs the chunk store's conformance, several-servers, resume, fault and gc tests
# (crates/store/tests/it) and the command-line ones (crates/cli/tests/cli/s3.rs) against node 1.
# Not part of every CI run (Garage takes long to build); the result is in docs/s3.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v garage >/dev/null || { echo "garage not found: cargo install garage@2.5.0 --locked" >&2; exit 1; }
dir=$(mktemp -d /tmp/ferry-garage.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
log() { printf '[garage %(%H:%M:%S)T] %s\n' -1 "$*"; }

secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
base=$((20000 + RANDOM % 20000))
for i in 1 2 3; do
  mkdir -p "$dir/n$i"
  cat > "$dir/n$i.toml" <<TOML
metadata_dir = "$dir/n$i/meta"
data_dir = "$dir/n$i/data"
db_engine = "sqlite"
replication_factor = 3
consistency_mode = "consistent"
rpc_bind_addr = "127.0.0.1:$((base + i * 10 + 1))"
rpc_public_addr = "127.0.0.1:$((base + i * 10 + 1))"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$((base + i * 10))"
root_domain = ".s3.garage.localhost"
TOML
  garage -c "$dir/n$i.toml" server >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
g() { garage -c "$dir/n1.toml" "$@"; }
for _ in $(seq 100); do g status >/dev/null 2>&1 && break; sleep 0.2; done
for i in 2 3; do
  for _ in $(seq 100); do
    id=$(garage -c "$dir/n$i.toml" node id -q 2>/dev/null) && break
    sleep 0.2
  done
  g node connect "$id" >/dev/null
done
for i in 1 2 3; do
  id=$(garage -c "$dir/n$i.toml" node id -q | cut -c1-16)
  g layout assign -z "dc$i" -c 1G "$id" >/dev/null
done
g layout apply --version 1 >/dev/null
key=$(g key create ferry-tests)
export FERRY_TEST_S3_ENDPOINT="http://127.0.0.1:$((base + 10))"
export FERRY_TEST_S3_ACCESS_KEY=$(awk '/Key ID:/ {print $3}' <<<"$key")
export FERRY_TEST_S3_SECRET_KEY=$(awk '/Secret key:/ {print $3}' <<<"$key")
export FERRY_TEST_S3_REGION=garage
g key allow --create-bucket ferry-tests >/dev/null
log "three nodes up, replication factor 3; S3 on $FERRY_TEST_S3_ENDPOINT"
g status | sed 's/^/  /'

suite() {
  cargo test -p ferry-store --test it s3 -- --test-threads 2 2>&1
  cargo test -p ferry --test cli s3:: -- --test-threads 2 2>&1
}
cargo build -q -p ferry-store -p ferry --tests
log "run 1: all three nodes"
suite >"$dir/run1.log" 2>&1 || true
grep -E "^test |^test result|panicked" "$dir/run1.log" || true

log "run 2: node 3 killed as soon as the first test is done (the others are under way)"
suite >"$dir/run2.log" 2>&1 &
run=$!
for _ in $(seq 600); do grep -q " \.\.\. ok$" "$dir/run2.log" 2>/dev/null && break; sleep 0.05; done
kill "${pids[2]}"
log "node 3 killed"
wait "$run" || true
grep -E "^test |^test result|panicked" "$dir/run2.log" || true
failed=$(cat "$dir/run1.log" "$dir/run2.log" | awk '/^test result:/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /^failed/) f += $i} END {print f+0}')
passed=$(cat "$dir/run1.log" "$dir/run2.log" | awk '/^test result:/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /^passed/) p += $i} END {print p+0}')
log "garage: $passed passed, $failed failed over both runs"
[ "$failed" = 0 ]
