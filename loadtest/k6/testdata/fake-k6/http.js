// Fake of 'k6/http' (see README.md): post records the request at the VU's virtual time, advances
// the clock by the fake latency and answers with a complete OpenAI-style SSE stream.
import { state } from './state.js';

function post(url, body, params) {
  if (state.init) throw new Error('fake k6: http.post() in the init context');
  const b = JSON.parse(body);
  const prompt = Array.isArray(b.prompt) ? b.prompt.length : 0;
  state.requests.push({ t: state.clock, vu: state.vu, iteration: state.iteration, url, headers: (params && params.headers) || {}, body: b });
  state.clock += state.latency;
  const usage = { prompt_tokens: prompt, completion_tokens: b.max_tokens, prompt_tokens_details: { cached_tokens: 0 } };
  const sse = 'data: ' + JSON.stringify({ choices: [{ index: 0, text: 'x' }] }) + '\n\n' +
    'data: ' + JSON.stringify({ choices: [], usage }) + '\n\ndata: [DONE]\n\n';
  return { status: 200, body: sse, timings: { waiting: state.latency * 1000, duration: state.latency * 1000 } };
}

export default { post };
