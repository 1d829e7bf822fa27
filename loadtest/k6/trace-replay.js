// Replays a Mooncake-format trace (JSON lines {timestamp ms, input_length,
// output_length, hash_ids}; every hash id is a 512-token prefix block, equal ids mean
// equal tokens) at its own arrival times, scaled by RATE_SCALE. Each VU takes the next
// request and sleeps until its arrival, so with enough VUs the replay is open-loop.
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e TRACE=testdata/traces/mooncake_synthetic_trace.jsonl \
//          -e RATE_SCALE=1 -e LIMIT=500 loadtest/k6/trace-replay.js
import exec from 'k6/execution';
import { sleep } from 'k6';
import { textSummary } from 'https://jslib.k6.io/k6-summary/0.1.0/index.js';
import { send, tokens, hitRateSummary } from './lib.js';

const BLOCK = 512;
const RATE_SCALE = parseFloat(__ENV.RATE_SCALE || '1');
const LIMIT = parseInt(__ENV.LIMIT || '0');
const VUS = parseInt(__ENV.VUS || '128');
const MAX_PROMPT = parseInt(__ENV.MAX_PROMPT || '0'); // cut long prompts for small engines (0 = as traced)

// open() runs once per VU in the init context; the parsed trace is small.
const lines = open(__ENV.TRACE || '../../testdata/traces/mooncake_synthetic_trace.jsonl').split('\n').filter((l) => l.trim() !== '');
const trace = (LIMIT > 0 ? lines.slice(0, LIMIT) : lines).map((l) => JSON.parse(l));

export const options = {
  scenarios: { replay: { executor: 'shared-iterations', vus: VUS, iterations: trace.length, maxDuration: '2h' } },
  thresholds: { kvmesh_failed: ['rate<0.01'] },
};

export default function () {
  const r = trace[exec.scenario.iterationInTest];
  if (!r) return;
  const due = r.timestamp / 1000 / RATE_SCALE;
  const now = (Date.now() - exec.scenario.startTime) / 1000;
  if (due > now) sleep(due - now);
  let prompt = [];
  for (let b = 0; b < r.hash_ids.length; b++) {
    const n = Math.min(BLOCK, r.input_length - b * BLOCK);
    if (n <= 0) break;
    prompt = prompt.concat(tokens(7 + r.hash_ids[b], n));
  }
  if (MAX_PROMPT > 0 && prompt.length > MAX_PROMPT) prompt = prompt.slice(0, MAX_PROMPT);
  send({ prompt, maxTokens: Math.max(1, r.output_length) });
}

export function handleSummary(data) {
  return { stdout: textSummary(data, { indent: ' ', enableColors: true }) + '\n' + hitRateSummary(data) };
}
