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

export const options = {
  scenarios: {
    shared_prefix: RATE > 0
      ? { executor: 'constant-arrival-rate', rate: Math.round(RATE * 100), timeUnit: '100s',
          duration: Math.ceil(TOTAL / RATE) + 's', preAllocatedVUs: VUS, maxVUs: VUS * 4 }
      : { executor: 'shared-iterations', vus: VUS, iterations: TOTAL, maxDuration: '30m' },
  },
  thresholds: { kvmesh_failed: ['rate<0.01'] },
};

// Requests of all groups interleave: iteration i takes group (i*7919) % GROUPS so
// consecutive requests hit different prefixes, as the public benchmarks shuffle them.
export default function () {
  const i = exec.scenario.iterationInTest % TOTAL;
  const group = (i * 7919) % GROUPS;
  const prompt = tokens(1 + group, SHARED).concat(tokens(1000003 + i, QUESTION));
  send({ prompt, maxTokens: OUTPUT, sessionId: 'g' + group + '-p' + i });
}

export function handleSummary(data) {
  return { stdout: textSummary(data, { indent: ' ', enableColors: true }) + '\n' + hitRateSummary(data) };
}
