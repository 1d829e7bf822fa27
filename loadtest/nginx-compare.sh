#!/usr/bin/env bash
# Requests/s and latency of `kvmesh ingress` against nginx doing round-robin proxy_pass to the same two
# simulated engines, measured by wrk (a separate C load generator), alternating rounds so that machine noise
# hits both alike. Loopback only; everything it starts is stopped on exit.
#
# usage: loadtest/nginx-compare.sh [ROUNDS] [SECONDS] [CONNECTIONS]
# needs: nginx (Debian nginx-light) and wrk (Debian wrk); builds bin/kvmesh.
set -euo pipefail
rounds=${1:-5} secs=${2:-5} conns=${3:-64}
cd "$(dirname "$0")/.."
command -v nginx >/dev/null && command -v wrk >/dev/null || { echo "needs nginx and wrk (apt-get install nginx-light wrk)" >&2; exit 1; }
go build -o bin/kvmesh ./cmd/kvmesh
dir=$(mktemp -d)
pids=()
cleanup() {
	[ -f "$dir/nginx.pid" ] && nginx -c "$dir/nginx.conf" -p "$dir" -s stop 2>/dev/null || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

# Engines at time scale 10^6: model time ~0, so what is measured is HTTP and proxy cost.
for port in 18021 18022; do
	bin/kvmesh sim --model m --http 127.0.0.1:$port --block-size 16 --gpu-blocks 4096 --time-scale 1000000 >"$dir/sim$port.log" 2>&1 &
	pids+=($!)
done
bin/kvmesh ingress --listen 127.0.0.1:18020 --engine m=http://127.0.0.1:18021 --engine m=http://127.0.0.1:18022 \
	--policy kvmesh --access-log=false >"$dir/ingress.log" 2>&1 &
pids+=($!)
mkdir -p "$dir/logs"
cat >"$dir/nginx.conf" <<CONF
worker_processes auto;
pid $dir/nginx.pid;
error_log $dir/logs/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  upstream engines { server 127.0.0.1:18021; server 127.0.0.1:18022; keepalive 256; }
  server {
    listen 127.0.0.1:18040;
    location / { proxy_pass http://engines; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
CONF
nginx -c "$dir/nginx.conf" -p "$dir"
cat >"$dir/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body   = '{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
LUA
for port in 18020 18040 18021; do # wait until each answers
	for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
done

run() { wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$dir/post.lua" "http://127.0.0.1:$1/v1/completions"; }
stats() { awk '/Requests\/sec/{rps=$2} /^ +50%/{p50=$2} /^ +99%/{p99=$2} END{printf "%10s req/s  p50 %8s  p99 %8s", rps, p50, p99}'; }
printf "%-6s %-44s %-44s\n" round "kvmesh ingress" "nginx"
for r in $(seq "$rounds"); do
	a=$(run 18020 | stats) b=$(run 18040 | stats)
	printf "%-6s %-44s %-44s\n" "$r" "$a" "$b"
done
echo "direct to one engine: $(run 18021 | stats)"
