// Fake of the 'k6' module (see README.md): sleep advances the running VU's virtual clock.
import { state } from './state.js';

export function sleep(s) {
  if (state.init) throw new Error('fake k6: sleep() in the init context');
  if (typeof s !== 'number' || !isFinite(s) || s < 0) throw new Error('fake k6: sleep(' + s + ')');
  state.clock += s;
}

export function check(val, sets) {
  let ok = true;
  for (const name of Object.keys(sets)) {
    if (!sets[name](val)) ok = false;
  }
  return ok;
}

export function group(name, fn) {
  return fn();
}

export function fail(msg) {
  throw new Error(msg);
}

export default { sleep, check, group, fail };
