// Shared helpers of the kvmesh k6 scenarios. k6 cannot stream responses, so these
// scripts send stream:true requests, read the whole SSE body at the end and take
// TTFT ≈ time to first byte (res.timings.waiting). That is exact for servers that
// send their headers with the first token and an underestimate for servers that send
// headers at once; `kvmesh loadtest` measures TTFT per token event and is the reference.
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Rate, Trend } from 'k6/metrics';

export const BASE_URL = (__ENV.KVMESH_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '').replace(/\/v1$/, '');
export const MODEL = __ENV.KVMESH_MODEL || 'kvmesh-sim';
export const API_KEY = __ENV.KVMESH_API_KEY || '';

export const ttft = new Trend('kvmesh_ttft', true);
export const e2e = new Trend('kvmesh_e2e', true);
export const promptTokens = new Counter('kvmesh_prompt_tokens');
export const cachedTokens = new Counter('kvmesh_cached_tokens');
export const outputTokens = new Counter('kvmesh_output_tokens');
export const failures = new Rate('kvmesh_failed');

// Vocabulary bounds match loadtest/workload: clear of special tokens in common vocabularies.
const TOKEN_BASE = 1000;
const TOKEN_RANGE = 30000;

// mulberry32: a tiny seeded PRNG so every VU derives the same prompt for the same id.
export function rng(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// tokens returns n deterministic token ids for a block identity (same id → same tokens).
export function tokens(blockId, n) {
  const r = rng(blockId * 2654435761 + 12345);
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = TOKEN_BASE + Math.floor(r() * TOKEN_RANGE);
  return out;
}

// words renders token ids as text for the chat endpoint (one word per id).
export function words(ids) {
  return ids.map((id) => 'w' + id).join(' ');
}

function headers(sessionId) {
  const h = { 'Content-Type': 'application/json' };
  if (API_KEY) h['Authorization'] = 'Bearer ' + API_KEY;
  if (sessionId) h['X-Session-ID'] = sessionId;
  return h;
}

// parseSSE returns { text, usage, error } from a whole SSE body.
export function parseSSE(body) {
  const out = { chunks: 0, usage: null, error: null, done: false };
  for (const line of String(body || '').split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const payload = line.slice(6).trim();
    if (payload === '[DONE]') { out.done = true; continue; }
    let j;
    try { j = JSON.parse(payload); } catch (e) { out.error = 'bad json'; continue; }
    if (j.error) out.error = j.error.message || 'error event';
    if (j.usage) out.usage = j.usage;
    if (j.choices && j.choices.length > 0) {
      const c = j.choices[0];
      if ((c.text && c.text.length) || (c.delta && c.delta.content)) out.chunks++;
    }
  }
  return out;
}

// send posts one streaming request (completions with token ids, or chat with text)
// and records the kvmesh_* metrics. Returns the parsed stream.
export function send({ prompt, messages, maxTokens, sessionId }) {
  const chat = messages !== undefined;
  const body = { model: MODEL, max_tokens: maxTokens, min_tokens: maxTokens, ignore_eos: true, temperature: 0,
    stream: true, stream_options: { include_usage: true } };
  if (chat) body.messages = messages; else body.prompt = prompt;
  const url = BASE_URL + (chat ? '/v1/chat/completions' : '/v1/completions');
  const res = http.post(url, JSON.stringify(body), { headers: headers(sessionId), timeout: '300s',
    tags: { endpoint: chat ? 'chat' : 'completions' } });
  const s = res.status === 200 ? parseSSE(res.body) : { error: 'http ' + res.status, usage: null, done: false };
  const ok = check(res, {
    'status 200': (r) => r.status === 200,
    'stream ends with [DONE]': () => s.done,
    'no error event': () => !s.error,
  });
  failures.add(!ok);
  if (ok) {
    ttft.add(res.timings.waiting);
    e2e.add(res.timings.duration);
    if (s.usage) {
      promptTokens.add(s.usage.prompt_tokens || 0);
      const d = s.usage.prompt_tokens_details;
      cachedTokens.add((d && d.cached_tokens) || 0);
      outputTokens.add(s.usage.completion_tokens || 0);
    }
  }
  return s;
}

// summary prints the prefix hit rate next to k6's own summary.
export function hitRateSummary(data) {
  const p = data.metrics.kvmesh_prompt_tokens ? data.metrics.kvmesh_prompt_tokens.values.count : 0;
  const c = data.metrics.kvmesh_cached_tokens ? data.metrics.kvmesh_cached_tokens.values.count : 0;
  const rate = p > 0 ? c / p : 0;
  return 'kvmesh prefix hit rate: ' + (100 * rate).toFixed(1) + '% (' + c + ' of ' + p + ' prompt tokens cached)\n';
}
