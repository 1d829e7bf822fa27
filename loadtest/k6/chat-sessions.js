// Multi-turn chat sessions: each VU runs conversations of TURNS turns on
// /v1/chat/completions with an X-Session-ID header; every turn resends the whole
// history plus a new user message, so a router with session affinity and prefix-aware
// routing keeps each conversation on the engine that caches it. THINK seconds pass
// between turns (a user reading), which is what session boost admission rewards.
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e SESSIONS=64 -e TURNS=5 loadtest/k6/chat-sessions.js
import exec from 'k6/execution';
import { sleep } from 'k6';
import { textSummary } from 'https://jslib.k6.io/k6-summary/0.1.0/index.js';
import { send, tokens, words, hitRateSummary } from './lib.js';

const SESSIONS = parseInt(__ENV.SESSIONS || '64');
const TURNS = parseInt(__ENV.TURNS || '5');
const SYSTEM = parseInt(__ENV.SYSTEM || '512'); // system prompt tokens, shared by every session
const USER = parseInt(__ENV.USER || '128'); // new user tokens per turn
const OUTPUT = parseInt(__ENV.OUTPUT || '64');
const THINK = parseFloat(__ENV.THINK || '1');
const VUS = parseInt(__ENV.VUS || '32');

export const options = {
  // k6 refuses fewer iterations than VUs.
  scenarios: { chat: { executor: 'shared-iterations', vus: Math.min(VUS, SESSIONS), iterations: SESSIONS, maxDuration: '1h' } },
  thresholds: { kvmesh_failed: ['rate<0.01'] },
};

export default function () {
  const s = exec.scenario.iterationInTest;
  const sessionId = 'k6-' + exec.scenario.startTime + '-' + s;
  const messages = [{ role: 'system', content: words(tokens(1, SYSTEM)) }];
  for (let turn = 0; turn < TURNS; turn++) {
    messages.push({ role: 'user', content: words(tokens(100000 + s * 1000 + turn, USER)) });
    const res = send({ messages, maxTokens: OUTPUT, sessionId });
    if (res.error) return;
    // The reply's exact text does not matter for caching experiments; a fixed stand-in
    // of the same length keeps the next turn's prompt deterministic.
    messages.push({ role: 'assistant', content: words(tokens(900000 + s * 1000 + turn, OUTPUT)) });
    if (turn + 1 < TURNS) sleep(THINK);
  }
}

export function handleSummary(data) {
  return { stdout: textSummary(data, { indent: ' ', enableColors: true }) + '\n' + hitRateSummary(data) };
}
