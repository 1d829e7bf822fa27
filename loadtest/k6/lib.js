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

// hitRateSummary is the prefix hit rate line of the summary.
export function hitRateSummary(data) {
  const p = data.metrics.kvmesh_prompt_tokens ? data.metrics.kvmesh_prompt_tokens.values.count : 0;
  const c = data.metrics.kvmesh_cached_tokens ? data.metrics.kvmesh_cached_tokens.values.count : 0;
  if (!(p > 0)) return 'kvmesh prefix hit rate: n/a (no prompt tokens reported)\n';
  return 'kvmesh prefix hit rate: ' + (100 * c / p).toFixed(1) + '% (' + c + ' of ' + p + ' prompt tokens cached)\n';
}

// ---- Environment variables ---------------------------------------------------------------------
// `k6 run` passes the system environment into __ENV (its --include-system-env-vars is on by
// default), so a script variable must not share a name with a common one (USER is the login name:
// chat-sessions.js's per-turn tokens are USER_TOKENS), and every value is checked: parseInt('alice')
// is NaN, which became an array length (RangeError in every iteration, no request sent) or an
// option k6 refused without naming the variable. These throw at init, naming the variable.

// envInt is the integer variable name (decimal digits; def when unset or empty), at least min.
export function envInt(name, def, min) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return def;
  const s = String(raw).trim();
  const v = Number(s);
  if (!/^[0-9]+$/.test(s) || !Number.isSafeInteger(v) || v < min) {
    throw new Error(name + '=' + JSON.stringify(String(raw)) + ': want an integer ≥ ' + min);
  }
  return v;
}

// envNumber is the number variable name (def when unset or empty): finite, at least min, or above
// it when above is set.
export function envNumber(name, def, min, above) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return def;
  const s = String(raw).trim();
  const v = Number(s);
  if (!/^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$/.test(s) || !isFinite(v) || v < min || (above && v === min)) {
    throw new Error(name + '=' + JSON.stringify(String(raw)) + ': want a number ' + (above ? '> ' : '≥ ') + min);
  }
  return v;
}

// arrivalRate writes rate (req/s, > 0) as k6's constant-arrival-rate takes it, a whole number of
// iterations per timeUnit: { rate, timeUnitS }, per 10^k s with the smallest k (up to 6) that makes
// it whole, so any rate with up to 6 decimals is exact (0.004 is 4 per 1000 s; it was rounded to
// 0 per 100 s and then raised to 1, 0.01 req/s). A rate with more decimals is rounded at the 6th
// when that is within 0.05 %; below that (under 0.001 req/s) it is refused.
export function arrivalRate(rate, name) {
  for (let k = 0, unit = 1; k <= 6; k++, unit *= 10) {
    const n = Math.round(rate * unit);
    if (n >= 1 && Math.abs(rate * unit - n) <= 1e-9 * rate * unit) return { rate: n, timeUnitS: unit };
  }
  const n = Math.round(rate * 1e6);
  if (n >= 1000) return { rate: n, timeUnitS: 1e6 };
  throw new Error((name || 'RATE') + '=' + rate + ': below 0.001 req/s a rate must have at most 6 decimals');
}

// ---- End-of-test summary ----------------------------------------------------------------------
// summaryText renders k6's end-of-test data (handleSummary's argument) as text: the thresholds, the
// checks, each metric's values, then the prefix hit rate. It replaces jslib's textSummary, which
// the scripts imported from https://jslib.k6.io at init, so a host without internet access could
// not start them. ANSI colours (the ✓ and ✗ marks only) are used only when k6 says stdout is a
// terminal (data.state.isStdOutTTY) and --no-color is not set (data.options.noColor).
export function summaryText(data) {
  const color = !!(data.state && data.state.isStdOutTTY) && !(data.options && data.options.noColor);
  const mark = (ok) => (ok ? (color ? '\x1b[32m✓\x1b[0m' : '✓') : color ? '\x1b[31m✗\x1b[0m' : '✗');
  const metrics = data.metrics || {};
  const names = Object.keys(metrics).sort();
  const out = [];
  const thresholds = [];
  for (const n of names) {
    const th = metrics[n].thresholds || {};
    for (const expr of Object.keys(th)) thresholds.push('  ' + mark(th[expr].ok) + ' ' + n + ': ' + expr);
  }
  if (thresholds.length > 0) out.push('thresholds', ...thresholds, '');
  const checks = [];
  (function walk(g, prefix) {
    if (!g) return;
    const list = (x) => (Array.isArray(x) ? x : Object.values(x || {})); // arrays; objects in older k6
    for (const c of list(g.checks)) {
      checks.push('  ' + mark(c.fails === 0) + ' ' + prefix + c.name + ': ' + c.passes + ' of ' + (c.passes + c.fails) + ' passed');
    }
    for (const sub of list(g.groups)) walk(sub, prefix + sub.name + ' / ');
  })(data.root_group, '');
  if (checks.length > 0) out.push('checks', ...checks, '');
  const width = names.reduce((w, n) => Math.max(w, n.length), 0) + 3;
  out.push('metrics');
  for (const n of names) out.push('  ' + (n + ' ').padEnd(width, '.') + ' ' + metricValues(metrics[n]));
  return out.join('\n') + '\n\n' + hitRateSummary(data);
}

// metricValues is one metric's values as text, times in ms or s.
function metricValues(m) {
  const v = m.values || {};
  const num = (x) => {
    if (typeof x !== 'number' || !isFinite(x)) return String(x);
    if (m.contains === 'time') return x < 1000 ? x.toFixed(2) + 'ms' : (x / 1000).toFixed(2) + 's';
    return Number.isInteger(x) ? String(x) : x.toFixed(3);
  };
  switch (m.type) {
    case 'counter':
      return num(v.count) + (typeof v.rate === 'number' ? ' (' + v.rate.toFixed(3) + '/s)' : '');
    case 'rate':
      return (typeof v.rate === 'number' ? (100 * v.rate).toFixed(2) + '%' : 'n/a') +
        (typeof v.passes === 'number' ? ' (' + v.passes + ' of ' + (v.passes + v.fails) + ')' : '');
    default: // trend (its summaryTrendStats), gauge
      return Object.keys(v).map((k) => k + '=' + num(v[k])).join(' ');
  }
}

// ---- Trace replay (trace-replay.js) -----------------------------------------------------------
// The functions below are pure (no k6 call), so k6_test.go runs them under node.

// parseTrace reads a trace as loadtest/workload/mooncake.go does (docs/BENCHMARKS.md, "Trace
// files"): JSON lines of {timestamp ms, input_length, output_length, hash_ids}, where equal hash ids
// are equal blocks of cfg.blockSize tokens (default 512; 16 for Bailian), in the forms aiperf's and
// Dynamo's tools write too:
//   - hash_ids covering the prompt rounded up (the last block partial) or down (input_length //
//     block ids); tokens past the last block, and a whole prompt without hash_ids, are the row's own;
//   - absolute (epoch ms) timestamps and rows in any order: arrivals are the timestamps less the
//     earliest, requests sorted by them (ties keep file order), cfg.limit keeps the earliest;
//   - aiperf's multi-turn rows: session_id plus delay and no timestamp is the session's next turn,
//     sent delay ms after the previous turn's answer (closed loop; its arrival is the estimate
//     delay after the previous turn's, which orders it);
//   - no output_length: cfg.output tokens (0: such a row is an error).
// cfg.format 'bailian' reads Alibaba's Bailian traces: timestamps in seconds, 16-token blocks, turns
// linked into sessions by chat_id / parent_chat_id. cfg.rateScale divides timestamps and delays.
// A malformed row throws an error naming its line (k6 then stops at init): a benchmark on a silently
// mangled trace would mislead.
//
// It returns the requests in arrival order: { line, arrival (s), input, output, ids (unsigned
// decimal strings), session ('' unless the trace names one), after (index of the request whose
// answer this one follows, -1 for none), think (s after that answer) }.
export function parseTrace(text, cfg) {
  const c = Object.assign({ blockSize: 0, output: 0, rateScale: 1, limit: 0, format: 'mooncake' }, cfg || {});
  if (c.format !== 'mooncake' && c.format !== 'bailian') throw new Error('trace format ' + c.format + ': want mooncake or bailian');
  const bailian = c.format === 'bailian';
  if (!c.blockSize) c.blockSize = bailian ? 16 : 512;
  if (!(c.rateScale > 0 && isFinite(c.rateScale))) throw new Error('trace rate scale ' + c.rateScale + ': want a finite number > 0');
  if (!Number.isInteger(c.blockSize) || c.blockSize < 1 || c.blockSize > 1 << 20) throw new Error('trace block size ' + c.blockSize + ': want 1..' + (1 << 20));
  if (!Number.isInteger(c.output) || c.output < 0) throw new Error('trace default output ' + c.output + ': want an integer ≥ 0');
  if (!Number.isInteger(c.limit) || c.limit < 0) throw new Error('trace limit ' + c.limit + ': want an integer ≥ 0');
  const rows = [];
  const prev = {}; // session → its latest row { at, row }
  const roots = {}; // Bailian: chat_id → its session's first chat_id
  const lines = String(text).split('\n');
  for (let k = 0; k < lines.length; k++) {
    if (lines[k].trim() === '') continue;
    rows.push(traceRow(lines[k], k + 1, rows.length, c, bailian, prev, roots));
  }
  if (rows.length === 0) throw new Error('the trace has no requests');
  let t0 = rows[0].at;
  for (const r of rows) t0 = Math.min(t0, r.at);
  const arrival = rows.map((r) => (r.at - t0) / c.rateScale / 1000);
  let order = rows.map((r, i) => i);
  order.sort((a, b) => arrival[a] - arrival[b] || a - b); // stable whatever the engine's sort
  if (c.limit > 0 && order.length > c.limit) order = order.slice(0, c.limit);
  const pos = {};
  order.forEach((i, k) => { pos[i] = k; });
  return order.map((i) => {
    const r = rows[i];
    const after = r.prev >= 0 && pos[r.prev] !== undefined ? pos[r.prev] : -1;
    return { line: r.line, arrival: arrival[i], input: r.input, output: Math.max(1, r.output), ids: r.ids,
      session: r.session, after, think: after >= 0 ? r.think / c.rateScale / 1000 : 0 };
  });
}

// traceChains groups the requests of parseTrace into what one k6 iteration sends: a request that
// follows none, then each turn that follows the previous one's answer, in order. Chains are in
// arrival order of their first request.
export function traceChains(reqs) {
  const next = reqs.map(() => -1);
  reqs.forEach((r, k) => {
    if (r.after < 0) return;
    if (next[r.after] >= 0) throw new Error('trace line ' + r.line + ': a second turn after line ' + reqs[r.after].line);
    next[r.after] = k;
  });
  const chains = [];
  reqs.forEach((r, k) => {
    if (r.after >= 0) return;
    const chain = [];
    for (let j = k; j >= 0; j = next[j]) chain.push(j);
    chains.push(chain);
  });
  return chains;
}

// tracePrompt is a request's token ids: each hash id's block (the same tokens wherever the id
// appears; the last block cut to the prompt), then the row's own tokens up to input_length.
export function tracePrompt(r, blockSize) {
  const out = [];
  let left = r.input;
  for (const id of r.ids) {
    const n = Math.min(left, blockSize);
    if (n <= 0) break;
    keyTokens('h' + id, n, out);
    left -= n;
  }
  if (left > 0) keyTokens('o' + r.line, left, out);
  return out;
}

// keyTokens appends to out (or a new array) n deterministic token ids for a string key (FNV-1a
// seeds the PRNG): hash ids may be 64-bit, past what a JavaScript number holds exactly, so they
// are keyed as text. The 'h' (hash id) and 'o' (a row's own tokens) prefixes keep the two apart.
export function keyTokens(key, n, out) {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193) >>> 0;
  const r = rng(h);
  out = out || [];
  for (let i = 0; i < n; i++) out.push(TOKEN_BASE + Math.floor(r() * TOKEN_RANGE));
  return out;
}

function traceRow(text, line, idx, c, bailian, prev, roots) {
  const bad = (msg) => new Error('trace line ' + line + ': ' + msg);
  let m;
  try {
    m = JSON.parse(quoteHashIds(text));
  } catch (e) {
    throw bad(e.message);
  }
  if (m === null || typeof m !== 'object' || Array.isArray(m)) throw bad('want a JSON object');
  if (m.input_length == null) {
    throw bad(m.text_input != null ? 'text_input without input_length: replaying a trace needs token counts' : 'missing input_length');
  }
  const isInt = (v) => typeof v === 'number' && Number.isInteger(v);
  if (!isInt(m.input_length)) throw bad('input_length ' + JSON.stringify(m.input_length) + ': want an integer');
  let session = textID(m.session_id, 'session_id', bad);
  let ts = m.timestamp;
  let delay = m.delay;
  if (ts != null && typeof ts !== 'number') throw bad('timestamp ' + JSON.stringify(ts) + ': want a number');
  if (delay != null && typeof delay !== 'number') throw bad('delay ' + JSON.stringify(delay) + ': want a number');
  if (bailian) {
    const chat = textID(m.chat_id, 'chat_id', bad);
    if (chat === '') throw bad('missing chat_id');
    const parent = textID(m.parent_chat_id, 'parent_chat_id', bad);
    let root = chat;
    if (parent !== '' && parent !== '-1') root = roots[parent] || parent;
    roots[chat] = root;
    session = 'b' + root;
    if (ts != null) { ts *= 1000; delay = null; } // seconds
  }
  let out = c.output;
  if (m.output_length != null) {
    if (!isInt(m.output_length)) throw bad('output_length ' + JSON.stringify(m.output_length) + ': want an integer');
    out = m.output_length;
  } else if (c.output === 0) {
    throw bad('missing output_length (and no default output length given: OUTPUT)');
  }
  const okMillis = (v) => v >= 0 && v <= 1e15;
  const last = session !== '' ? prev[session] : undefined;
  const row = { line, at: 0, input: m.input_length, output: out, ids: [], session, prev: -1, think: 0 };
  if (ts != null) {
    if (!okMillis(ts)) throw bad('timestamp ' + ts);
    row.at = ts;
  } else if (delay != null && last) {
    if (!okMillis(delay)) throw bad('delay ' + delay);
    row.at = last.at + delay;
    row.prev = last.row;
    row.think = delay;
  } else {
    throw bad('missing timestamp (a row without one needs a session_id and a delay after an earlier row of its session)');
  }
  if (session !== '') prev[session] = { at: row.at, row: idx };
  if (row.input <= 0 || row.output < 0) throw bad('input_length ' + row.input + ', output_length ' + row.output);
  if (m.hash_ids != null) {
    if (!Array.isArray(m.hash_ids)) throw bad('hash_ids: want an array');
    row.ids = m.hash_ids.map((v) => unsigned64(v, bad));
  }
  const n = row.ids.length;
  const bt = c.blockSize;
  if (n > 0 && (row.input <= (n - 1) * bt || row.input >= (n + 1) * bt)) {
    let hint = '';
    for (let b = 1; b <= 1 << 20 && hint === ''; b *= 2) {
      if (row.input > (n - 1) * b && row.input < (n + 1) * b) hint = ' (its blocks look like ' + b + ' tokens: TRACE_BLOCK_SIZE=' + b + '?)';
    }
    throw bad('input_length ' + row.input + ' does not fit ' + n + ' blocks of ' + bt + ' tokens' + hint);
  }
  return row;
}

// quoteHashIds turns the numbers of a line's hash_ids into strings ('#' and the number's text)
// before JSON.parse, which would round 64-bit hashes to the nearest double (and so merge different
// ones); a string in hash_ids stays one, without the '#', and is refused as the Go reader does.
function quoteHashIds(text) {
  return text.replace(/("hash_ids"\s*:\s*\[)([^\]]*)\]/g,
    (all, head, body) => head + body.replace(/[^,\s]+/g, (v) => (v[0] === '"' ? v : '"#' + v + '"')) + ']');
}

// textID is a session_id's (or chat_id's) text: a JSON string or number; '' when absent.
function textID(v, name, bad) {
  if (v == null) return '';
  if (typeof v === 'string') return v;
  if (typeof v === 'number') return String(v);
  throw bad(name + ' ' + JSON.stringify(v) + ': want a string or a number');
}

const TWO64 = '18446744073709551616';

// unsigned64 is a hash id as an unsigned 64-bit decimal string: an unsigned or a signed 64-bit
// integer (a hash printed signed keeps its bits, as in the Go reader).
function unsigned64(v, bad) {
  const s = String(v);
  const m = /^#(-?)(0|[1-9][0-9]*)$/.exec(s);
  const fits = (a, max) => a.length < max.length || (a.length === max.length && a <= max);
  if (!m || (m[1] === '' && !fits(m[2], '18446744073709551615')) || (m[1] === '-' && !fits(m[2], '9223372036854775808'))) {
    throw bad('hash id ' + JSON.stringify(v).replace(/^"#(.*)"$/, '$1').slice(0, 40) + ': want a 64-bit integer');
  }
  if (m[1] === '' || m[2] === '0') return m[2];
  // 2^64 − |v|, digit by digit.
  const a = TWO64;
  const b = m[2].padStart(a.length, '0');
  let out = '';
  let borrow = 0;
  for (let i = a.length - 1; i >= 0; i--) {
    let d = a.charCodeAt(i) - b.charCodeAt(i) - borrow;
    borrow = d < 0 ? 1 : 0;
    if (d < 0) d += 10;
    out = d + out;
  }
  return out.replace(/^0+(?=.)/, '');
}
