// Fake of 'k6/metrics' (see README.md): every metric keeps its samples' count, sum, non-zero
// count and values; harness.mjs turns them into the summary's values as k6 computes them.
import { state } from './state.js';

class Metric {
  constructor(name, type, isTime) {
    this.name = name;
    state.metrics[name] = { type, contains: isTime ? 'time' : 'default', count: 0, sum: 0, nonZero: 0, samples: [] };
  }
  add(v) {
    if (state.init) throw new Error('fake k6: metric add() in the init context');
    const m = state.metrics[this.name];
    const x = Number(v);
    m.count++;
    m.sum += x;
    if (x !== 0) m.nonZero++;
    m.samples.push(x);
  }
}

export class Counter extends Metric { constructor(n, t) { super(n, 'counter', t); } }
export class Rate extends Metric { constructor(n) { super(n, 'rate', false); } }
export class Trend extends Metric { constructor(n, t) { super(n, 'trend', t); } }
export class Gauge extends Metric { constructor(n, t) { super(n, 'gauge', t); } }
