// Shared-prefix workload (SGLang / Kthena / llm-d router benchmarks): GROUPS groups of
// PROMPTS prompts; every prompt of a group starts with the group's SHARED tokens and
// ends with its own QUESTION tokens; OUTPUT tokens are generated. Sent as token-id
// prompts to /v1/completions, open-loop at RATE req/s (or closed-loop with RATE=0 and
// VUS virtual users).
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e GROUPS=32 -e PROMPTS=16 loadtest/k6/shared-prefix.js
import exec from 'k6/execution';
import { send, tokens, envInt, envNumber, arrivalRate, summaryText } from './lib.js';

const GROUPS = envInt('GROUPS', 32, 1);
const PROMPTS = envInt('PROMPTS', 16, 1);
const SHARED = envInt('SHARED', 2048, 0);
const QUESTION = envInt('QUESTION', 128, 0);
const OUTPUT = envInt('OUTPUT', 64, 1);
const RATE = envNumber('RATE', 0, 0);
const VUS = envInt('VUS', 64, 1);
const TOTAL = GROUPS * PROMPTS;
if (SHARED + QUESTION < 1) throw new Error('SHARED=' + SHARED + ', QUESTION=' + QUESTION + ': a prompt needs at least one token');
// constant-arrival-rate starts ceil(duration × rate) iterations, whole ones per timeUnit: RATE is
// written exactly as whole iterations per 10^k s (arrivalRate) and the duration rounded up to the
// millisecond, so at least TOTAL start; those past TOTAL send nothing, so each prompt is sent
// exactly once (a repeat would be fully cached and inflate the hit rate).
const ARRIVALS = RATE > 0 ? arrivalRate(RATE, 'RATE') : null;

export const options = {
  scenarios: {
    shared_prefix: ARRIVALS
      ? { executor: 'constant-arrival-rate', rate: ARRIVALS.rate, timeUnit: ARRIVALS.timeUnitS + 's',
          duration: Math.ceil(TOTAL * ARRIVALS.timeUnitS * 1000 / ARRIVALS.rate) + 'ms', preAllocatedVUs: VUS, maxVUs: VUS * 4 }
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
  return { stdout: summaryText(data) };
}
