#!/bin/bash
# The engine renders chat with a template the ingress does not have (vLLM's
# --chat-template with a tool-calling template; the sidecars publish the
# model's own): a live mesh on loopback (NATS, 4 simulators with KV events,
# 4 sidecars, 1 ingress), a shared-prefix chat load, and the ingress's
# prompt-token check and cached-token counters. docs/TOKENIZER.md.
#
#   hack/tokencheck-live.sh 0 19300       # the engine /tokenize fallback off
#   hack/tokencheck-live.sh 250ms 19400   # on (the default): switches after 3 different counts
#   EXTRA="--chat-template m=testdata/tokenizer/templates/vllm-llama3.1_json.jinja" hack/tokencheck-live.sh 0 19500  # the ingress has the engine's template
set -eu
T=$1; B=${2:-19300}
cd "$(dirname "$0")/.."
W=$(mktemp -d)
go build -o "$W/kvmesh" ./cmd/kvmesh
go build -tags chaos -o "$W/natsd" ./test/mesh/natsd
D=$(go env GOMODCACHE)/github.com/daulet/tokenizers@v1.24.0/test/data
[ -d "$D" ] || go mod download github.com/daulet/tokenizers
mkdir -p "$W/llama" && cp "$D/Meta-Llama-3-8B-Instruct.json" "$W/llama/tokenizer.json" && cp "$D/meta-llama-3-8b-instruct/tokenizer_config.json" "$W/llama/"
KV=$W/kvmesh
TPL=testdata/tokenizer/templates/vllm-llama3.1_json.jinja
pids=()
trap 'kill ${pids[@]} 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
"$W/natsd" -port $((B+90)) -store "$W/js" > "$W/nats.log" 2>&1 & pids+=($!)
sleep 1
join() { local s=""; for j in 0 1 2 3 4; do [ "$j" != "$1" ] && s="$s,127.0.0.1:$((B+60+j))"; done; echo "${s#,}"; }
for i in 0 1 2 3; do
  "$KV" sidecar --model m --engine-id e$i --engine-url http://127.0.0.1:$((B+i)) --events tcp://127.0.0.1:$((B+20+i)) --bind-events \
    --replay tcp://127.0.0.1:$((B+30+i)) --block-size 16 --nats nats://127.0.0.1:$((B+90)) --gossip-bind 127.0.0.1:$((B+60+i)) \
    --join "$(join $i)" --gossip-profile local --admin 127.0.0.1:$((B+40+i)) --log-level warn > "$W/sc$i.log" 2>&1 & pids+=($!)
  sleep 0.2
  "$KV" sim --model m --http 127.0.0.1:$((B+i)) --kv-events tcp://127.0.0.1:$((B+20+i)) --kv-replay tcp://127.0.0.1:$((B+30+i)) \
    --tokenizer "$W/llama" --chat-template $TPL --gpu-blocks 2000 --block-size 16 --seed $i --log-level warn > "$W/sim$i.log" 2>&1 & pids+=($!)
done
sleep 1
# shellcheck disable=SC2086
"$KV" ingress --listen 127.0.0.1:$((B+10)) --admin 127.0.0.1:$((B+11)) --tokenizer m="$W/llama" --policy kvmesh \
  --engine-tokenize-timeout "$T" --access-log=false ${EXTRA:-} --nats nats://127.0.0.1:$((B+90)) \
  --gossip-bind 127.0.0.1:$((B+64)) --join "$(join 4)" --gossip-profile local > "$W/ingress.log" 2>&1 & pids+=($!)
for _ in $(seq 1 100); do curl -sf 127.0.0.1:$((B+10))/ready >/dev/null && break; sleep 0.2; done
"$KV" loadtest --url http://127.0.0.1:$((B+10)) --model m --endpoint chat --workload shared-prefix --groups 48 --prompts 8 \
  --shared 1024 --question 64 --output 16 --rate 3 --quiet --json > "$W/report.json"
curl -s 127.0.0.1:$((B+11))/metrics | grep -E "^kvmesh_ingress_(cached_prompt|prompt_token_checks|engine_tokenize)"
python3 - "$W/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("requests", r["requests"], "failed", r["failed"], "prefix hit rate %.3f" % r["prefix_hit_rate"],
      "TTFT mean %.3f s p50 %.3f s p99 %.3f s" % (r["ttft"]["mean_s"], r["ttft"]["p50_s"], r["ttft"]["p99_s"]))
PY
