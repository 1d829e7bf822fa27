// harness.mjs runs k6 scripts under the fake of k6's API (see README.md), for k6_test.go:
//
//   node harness.mjs cases.json
//
// cases.json is a list of { script: the script to run (a copy whose imports resolve to the fake
// modules), scriptDir: the directory k6 would resolve the script's relative open() paths against
// (the original's), env: __ENV, latency: s per fake request (default 0.5), initOnly: only run the
// init context, call: { fn, args }: after the init context, only call the script's exported
// fn(...args), stdoutTTY and noColor: what k6 tells handleSummary of the terminal }. Each case
// runs on fresh copies of the scripts (so fresh modules) in a directory of its own. It prints a
// JSON list, one object per case: { initError (thrown in the init context), runError (thrown by
// the fake executor, e.g. an option k6 refuses, or by call), value (call's result), options,
// requests: [{ t (s after the scenario start), vu, iteration, url, headers, body }], errors
// (exceptions thrown by iterations, which k6 logs and counts without stopping), dropped,
// iterations, metrics, summary }.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const state = {};
globalThis.__fakeK6 = state; // read by the fake modules (state.js): reset in place for each case
let cfg = null;
// k6's open(): init context only; a relative path is resolved against the script's directory.
globalThis.open = function (p) {
  if (!state.init) throw new Error('fake k6: open() outside the init context');
  if (!p) throw new Error("open() can't be used with an empty filename");
  return fs.readFileSync(path.isAbsolute(p) ? p : path.join(cfg.scriptDir, p), 'utf8');
};
// A VU's time is virtual: it moves only with sleep() and the fake requests.
Date.now = () => state.startTime + state.clock * 1000;

let result = null;

// duration parses a k6 duration ('1h30m', '26s', '25600ms'; a number is milliseconds) into ms.
function duration(v, what) {
  if (typeof v === 'number') return v;
  const s = String(v);
  let ms = 0;
  let rest = s;
  const units = { ms: 1, s: 1000, m: 60000, h: 3600000 };
  while (rest !== '') {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)/.exec(rest);
    if (!m) throw new Error('fake k6: ' + what + ' ' + JSON.stringify(s) + ' is not a k6 duration');
    ms += parseFloat(m[1]) * units[m[2]];
    rest = rest.slice(m[0].length);
  }
  return ms;
}

function posInt(v, what) {
  if (!Number.isInteger(v) || v <= 0) throw new Error('fake k6: ' + what + ' ' + v + ': want an integer > 0');
  return v;
}

function iterate(fn, vu, start) {
  state.vu = vu;
  state.iteration = result.iterations++;
  state.clock = start;
  try {
    fn();
  } catch (e) {
    result.errors.push({ iteration: state.iteration, message: String((e && e.stack) || e) });
  }
  return state.clock;
}

// shared-iterations: `iterations` iterations in order, each taken by the VU free first; none
// starts after maxDuration. k6 refuses fewer iterations than VUs.
function sharedIterations(sc, fn) {
  const vus = posInt(sc.vus === undefined ? 1 : sc.vus, 'vus');
  const iterations = posInt(sc.iterations === undefined ? 1 : sc.iterations, 'iterations');
  if (iterations < vus) throw new Error('fake k6: the number of iterations (' + iterations + ") shouldn't be less than the number of VUs (" + vus + ')');
  const maxDuration = duration(sc.maxDuration === undefined ? '10m' : sc.maxDuration, 'maxDuration') / 1000;
  const free = new Array(vus).fill(0);
  for (let k = 0; k < iterations; k++) {
    let v = 0;
    for (let j = 1; j < vus; j++) if (free[j] < free[v]) v = j;
    if (free[v] >= maxDuration) {
      result.dropped += iterations - k;
      return;
    }
    free[v] = iterate(fn, v, free[v]);
  }
}

// constant-arrival-rate: an iteration starts every timeUnit/rate while the time is below
// duration, on a free VU (of maxVUs); with none free it is dropped.
function constantArrivalRate(sc, fn) {
  const rate = posInt(sc.rate, 'rate');
  const unit = duration(sc.timeUnit === undefined ? '1s' : sc.timeUnit, 'timeUnit');
  const dur = duration(sc.duration, 'duration');
  const pre = posInt(sc.preAllocatedVUs, 'preAllocatedVUs');
  const max = sc.maxVUs === undefined ? pre : posInt(sc.maxVUs, 'maxVUs');
  if (max < pre) throw new Error('fake k6: maxVUs < preAllocatedVUs');
  const free = new Array(max).fill(0);
  for (let n = 0; n * unit < dur * rate; n++) { // n·unit/rate < dur, exactly for integer ms
    const t = (n * unit) / rate / 1000;
    let v = -1;
    for (let j = 0; j < max; j++) if (free[j] <= t) { v = j; break; }
    if (v < 0) {
      result.dropped++;
      continue;
    }
    free[v] = iterate(fn, v, t);
  }
}

// summaryData is handleSummary's argument as k6 builds it (the parts the scripts read): each
// metric's type, contains and values (counter: count, rate; rate: rate, passes, fails; trend: avg,
// min, med, max, p(90), p(95); gauge: value, min, max) and its thresholds (evaluated here for the
// rate<x form only), state.isStdOutTTY and options.noColor (the case's stdoutTTY and noColor),
// root_group's checks (none: the fake's check() keeps no counts).
function summaryData(options) {
  const thresholds = (options && options.thresholds) || {};
  const duration = Math.max(state.clock, 1e-9);
  const metrics = {};
  for (const name of Object.keys(state.metrics)) {
    const m = state.metrics[name];
    const xs = m.samples.slice().sort((a, b) => a - b);
    const q = (p) => (xs.length === 0 ? 0 : xs[Math.min(xs.length - 1, Math.floor(p * (xs.length - 1)))]);
    let values;
    if (m.type === 'counter') values = { count: m.sum, rate: m.sum / duration };
    else if (m.type === 'rate') values = { rate: m.count ? m.nonZero / m.count : 0, passes: m.nonZero, fails: m.count - m.nonZero };
    else if (m.type === 'gauge') values = { value: xs.length ? m.samples[m.samples.length - 1] : 0, min: q(0), max: q(1) };
    else values = { avg: m.count ? m.sum / m.count : 0, min: q(0), med: q(0.5), max: q(1), 'p(90)': q(0.9), 'p(95)': q(0.95) };
    const th = {};
    for (const expr of thresholds[name] || []) {
      const r = /^rate<([0-9.]+)$/.exec(expr);
      th[expr] = { ok: r ? values.rate < Number(r[1]) : true };
    }
    metrics[name] = { type: m.type, contains: m.contains, values, thresholds: th };
  }
  return { metrics, root_group: { name: '', path: '', groups: [], checks: [] },
    state: { isStdOutTTY: !!cfg.stdoutTTY, isStdErrTTY: false, testRunDurationMs: duration * 1000 },
    options: { summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)'], summaryTimeUnit: '', noColor: !!cfg.noColor } };
}

async function runCase(i) {
  Object.assign(state, {
    startTime: 1700000000000, clock: 0, init: true, latency: cfg.latency === undefined ? 0.5 : cfg.latency,
    vu: 0, iteration: 0, scenarioName: '', requests: [], metrics: {},
  });
  globalThis.__ENV = Object.assign({}, cfg.env || {});
  result = { initError: null, runError: null, value: null, options: null, requests: [], errors: [], dropped: 0, iterations: 0, metrics: {}, summary: null };
  const src = path.dirname(path.resolve(cfg.script));
  const dir = fs.mkdtempSync(path.join(src, 'case-' + i + '-'));
  for (const f of fs.readdirSync(src)) if (f.endsWith('.js')) fs.copyFileSync(path.join(src, f), path.join(dir, f));
  let mod;
  try {
    mod = await import(pathToFileURL(path.join(dir, path.basename(cfg.script))).href);
  } catch (e) {
    result.initError = String((e && e.stack) || e);
    return result;
  }
  state.init = false;
  result.options = mod.options;
  try {
    if (cfg.call) {
      result.value = mod[cfg.call.fn](...cfg.call.args);
    } else if (!cfg.initOnly) {
      for (const name of Object.keys(mod.options.scenarios)) {
        const sc = mod.options.scenarios[name];
        const fn = mod[sc.exec || 'default'];
        state.scenarioName = name;
        if (sc.executor === 'shared-iterations') sharedIterations(sc, fn);
        else if (sc.executor === 'constant-arrival-rate') constantArrivalRate(sc, fn);
        else throw new Error('fake k6: executor ' + sc.executor + ' is not faked');
      }
      if (mod.handleSummary) result.summary = mod.handleSummary(summaryData(mod.options));
    }
  } catch (e) {
    result.runError = String((e && e.stack) || e);
  }
  result.requests = state.requests;
  result.metrics = state.metrics;
  return result;
}

const out = [];
for (let i = 0; i < cases.length; i++) {
  cfg = cases[i];
  out.push(await runCase(i));
}
process.stdout.write(JSON.stringify(out));
