// Shared-prefix workload (SGLang / Kthena / llm-d router benchmarks): GROUPS groups of
// PROMPTS prompts; every prompt of a group starts with the group's SHARED tokens and
// ends with its own QUESTION tokens; OUTPUT tokens are generated. Sent as token-id
// prompts to /v1/completions, open-loop at RATE req/s (or closed-loop with RATE=0 and
// VUS virtual users).
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e GROUPS=32 -e PROMPTS=16 loadtest/k6/shared-prefix.js
import exec from 'k6/execution';
import { textSummary } from 'https://jslib.k6.io/k6-summary/0.1.0/index.js';
import { send, tokens, hitRateSummary } from './lib.js';

const GROUPS = parseInt(__ENV.GROUPS || '32');
const PROMPTS = parseInt(__ENV.PROMPTS || '16');
const SHARED = parseInt(__ENV.SHARED || '2048');
const QUESTION = parseInt(__ENV.QUESTION || '128');
const OUTPUT = parseInt(__ENV.OUTPUT || '64');
const RATE = parseFloat(__ENV.RATE || '0');
const VUS = parseInt(__ENV.VUS || '64');
const TOTAL = GROUPS * PROMPTS;
// constant-arrival-rate starts ceil(duration × rate) iterations, whole ones per timeUnit: the rate
// is taken per 100 s (two decimals of RATE) and the duration rounded up to the millisecond, so at
// least TOTAL start; those past TOTAL send nothing, so each prompt is sent exactly once (a repeat
// would be fully cached and inflate the hit rate).
const RATE_PER_100S = Math.max(1, Math.round(RATE * 100));

export const options = {
  scenarios: {
    shared_prefix: RATE > 0
      ? { executor: 'constant-arrival-rate', rate: RATE_PER_100S, timeUnit: '100s',
          duration: Math.ceil(TOTAL * 100000 / RATE_PER_100S) + 'ms', preAllocatedVUs: VUS, maxVUs: VUS * 4 }
      // k6 refuses fewer iterations than VUs.
      : { executor: 'shared-iterations', vus: Math.min(VUS, TOTAL), iterations: TOTAL, maxDuration: '30m' },
  },
  thresholds: { kvmesh_failed: ['rate<0.01'] },
};

// Requests of all groups interleave: iteration i takes group (i*7919) % GROUPS so
// consecutive requests hit different prefixes, as the public benchmarks shuffle them.
export default function () {
  const i = exec.scenario.iterationInTest;
  if (i >= TOTAL) return;
  const group = (i * 7919) % GROUPS;
  const prompt = tokens(1 + group, SHARED).concat(tokens(1000003 + i, QUESTION));
  send({ prompt, maxTokens: OUTPUT, sessionId: 'g' + group + '-p' + i });
}

export function handleSummary(data) {
  return { stdout: textSummary(data, { indent: ' ', enableColors: true }) + '\n' + hitRateSummary(data) };
}
