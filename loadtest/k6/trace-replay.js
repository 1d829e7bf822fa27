// Replays a Mooncake-format trace (JSON lines {timestamp ms, input_length, output_length,
// hash_ids}; every hash id is a TRACE_BLOCK_SIZE-token prefix block, equal ids mean equal tokens)
// at its own arrival times, scaled by RATE_SCALE. It reads the forms loadtest/workload/mooncake.go
// reads (docs/BENCHMARKS.md, "Trace files"; parseTrace in lib.js): epoch timestamps and unsorted
// rows (arrivals count from the earliest), hash_ids rounded up or down (input_length is honoured,
// tokens past the last block are the row's own, as are those of a row without hash_ids), rows
// without output_length (OUTPUT tokens), aiperf's multi-turn rows (session_id + delay: the turn is
// sent delay ms after the previous turn's answer) and, with TRACE_FORMAT=bailian, Bailian's traces.
//
// Each iteration takes the next request that follows no other, sleeps until its arrival, sends it
// and then each turn of its session that follows it, delay after the previous answer. With more
// VUs than sessions in flight the replay is open-loop between sessions, closed-loop within one.
//
// k6 resolves a relative TRACE against this script's directory (loadtest/k6/), not the working
// directory, so give an absolute path:
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e TRACE=$PWD/testdata/traces/mooncake_synthetic_trace.jsonl \
//          -e RATE_SCALE=1 -e LIMIT=500 loadtest/k6/trace-replay.js
import exec from 'k6/execution';
import { sleep } from 'k6';
import { send, envInt, envNumber, summaryText, parseTrace, traceChains, tracePrompt } from './lib.js';

const TRACE = __ENV.TRACE || '../../testdata/traces/mooncake_synthetic_trace.jsonl';
const FORMAT = __ENV.TRACE_FORMAT || 'mooncake'; // or bailian
const BLOCK = envInt('TRACE_BLOCK_SIZE', FORMAT === 'bailian' ? 16 : 512, 1);
const OUTPUT = envInt('OUTPUT', 64, 0); // rows without output_length
const RATE_SCALE = envNumber('RATE_SCALE', 1, 0, true);
const LIMIT = envInt('LIMIT', 0, 0);
const VUS = envInt('VUS', 128, 1);
const MAX_PROMPT = envInt('MAX_PROMPT', 0, 0); // cut long prompts for small engines (0 = as traced)

// open() runs once per VU in the init context; the parsed trace is small.
let text;
try {
  text = open(TRACE);
} catch (e) {
  throw new Error('TRACE=' + TRACE + ': ' + e + ' (k6 resolves a relative path against loadtest/k6/; give an absolute one, e.g. -e TRACE=$PWD/testdata/traces/…)');
}
const trace = parseTrace(text, { blockSize: BLOCK, output: OUTPUT, rateScale: RATE_SCALE, limit: LIMIT, format: FORMAT });
const chains = traceChains(trace);

export const options = {
  // k6 refuses fewer iterations than VUs.
  scenarios: { replay: { executor: 'shared-iterations', vus: Math.max(1, Math.min(VUS, chains.length)), iterations: chains.length, maxDuration: '2h' } },
  thresholds: { kvmesh_failed: ['rate<0.01'] },
};

export default function () {
  const chain = chains[exec.scenario.iterationInTest];
  if (!chain) return;
  const due = trace[chain[0]].arrival;
  const now = (Date.now() - exec.scenario.startTime) / 1000;
  if (due > now) sleep(due - now);
  for (let k = 0; k < chain.length; k++) {
    const r = trace[chain[k]];
    if (k > 0 && r.think > 0) sleep(r.think); // after the previous turn's answer (or failure)
    let prompt = tracePrompt(r, BLOCK);
    if (MAX_PROMPT > 0 && prompt.length > MAX_PROMPT) prompt = prompt.slice(0, MAX_PROMPT);
    send({ prompt, maxTokens: r.output, sessionId: r.session || undefined });
  }
}

export function handleSummary(data) {
  return { stdout: summaryText(data) };
}
