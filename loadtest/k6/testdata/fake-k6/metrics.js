// Fake of 'k6/metrics' (see README.md): every metric keeps its count and sum.
import { state } from './state.js';

class Metric {
  constructor(name, type) {
    this.name = name;
    state.metrics[name] = { type, count: 0, sum: 0 };
  }
  add(v) {
    if (state.init) throw new Error('fake k6: metric add() in the init context');
    const m = state.metrics[this.name];
    m.count++;
    m.sum += Number(v);
  }
}

export class Counter extends Metric { constructor(n) { super(n, 'counter'); } }
export class Rate extends Metric { constructor(n) { super(n, 'rate'); } }
export class Trend extends Metric { constructor(n) { super(n, 'trend'); } }
export class Gauge extends Metric { constructor(n) { super(n, 'gauge'); } }
