// Multi-turn chat sessions: each VU runs conversations of TURNS turns on
// /v1/chat/completions with an X-Session-ID header; every turn resends the whole
// history plus a new user message, so a router with session affinity and prefix-aware
// routing keeps each conversation on the engine that caches it. THINK seconds pass
// between turns (a user reading), which is what session boost admission rewards.
//
//   k6 run -e KVMESH_URL=http://127.0.0.1:8000 -e SESSIONS=64 -e TURNS=5 loadtest/k6/chat-sessions.js
import exec from 'k6/execution';
import { sleep } from 'k6';
import { send, tokens, words, envInt, envNumber, summaryText } from './lib.js';

const SESSIONS = envInt('SESSIONS', 64, 1);
const TURNS = envInt('TURNS', 5, 1);
const SYSTEM = envInt('SYSTEM', 512, 0); // system prompt tokens, shared by every session
// New user tokens per turn: USER_TOKENS. The variable was USER, which `k6 run` also takes from the
// shell (the login name); USER is still read for older command lines, but only as a number.
const USER_TOKENS = __ENV.USER_TOKENS !== undefined && __ENV.USER_TOKENS !== '' ? envInt('USER_TOKENS', 128, 1)
  : /^\s*[0-9]+\s*$/.test(String(__ENV.USER || '')) ? envInt('USER', 128, 1) : 128;
const OUTPUT = envInt('OUTPUT', 64, 1);
const THINK = envNumber('THINK', 1, 0);
const VUS = envInt('VUS', 32, 1);

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
    messages.push({ role: 'user', content: words(tokens(100000 + s * 1000 + turn, USER_TOKENS)) });
    const res = send({ messages, maxTokens: OUTPUT, sessionId });
    if (res.error) return;
    // The reply's exact text does not matter for caching experiments; a fixed stand-in
    // of the same length keeps the next turn's prompt deterministic.
    messages.push({ role: 'assistant', content: words(tokens(900000 + s * 1000 + turn, OUTPUT)) });
    if (turn + 1 < TURNS) sleep(THINK);
  }
}

export function handleSummary(data) {
  return { stdout: summaryText(data) };
}
