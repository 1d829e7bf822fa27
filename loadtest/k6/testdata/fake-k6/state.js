// Fake of k6's runtime state, shared by the fake k6 modules and harness.mjs (see README.md).
export const state = globalThis.__fakeK6 || (globalThis.__fakeK6 = {
  startTime: 1700000000000, // ms; the fake scenario's start (k6: exec.scenario.startTime)
  clock: 0, // s since startTime on the running VU
  init: true,
  latency: 0.5, // s per fake request
  vu: 0,
  iteration: 0,
  scenarioName: '',
  requests: [],
  metrics: {},
});
