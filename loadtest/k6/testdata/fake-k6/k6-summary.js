// Fake of jslib's k6-summary (https://jslib.k6.io/k6-summary/…/index.js; see README.md).
export function textSummary(data) {
  return 'fake k6 summary of ' + Object.keys(data.metrics).length + ' metrics';
}
