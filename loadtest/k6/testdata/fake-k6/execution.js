// Fake of 'k6/execution' (see README.md).
import { state } from './state.js';

export default {
  get scenario() {
    if (state.init) throw new Error('fake k6: exec.scenario in the init context');
    return { name: state.scenarioName, startTime: state.startTime, iterationInTest: state.iteration };
  },
  get vu() {
    return { idInTest: state.vu + 1 };
  },
};
