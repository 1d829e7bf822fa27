// Driven by responses_test.go: the Responses API through two ingress
// replicas with the official client; prints one JSON object.
import OpenAI from "openai";
import { env, capture, done } from "./harness.mjs";

const { model } = env;
const [a, b] = process.env.KVMESH_BASE_URLS.split(",").map((baseURL) =>
  new OpenAI({ baseURL, apiKey: env.apiKey, maxRetries: 0, timeout: 30000 }));

await capture("create", async () => {
  const { data: r, response } = await a.responses.create({ model, instructions: "Be brief.", input: "Hello there", max_output_tokens: 8 }).withResponse();
  return { id: r.id, object: r.object, status: r.status, text: r.output_text, usage: r.usage, engine: response.headers.get("x-kvmesh-engine") };
});

// Conversations continued through the other replica: each follow-up must
// reach the engine that stored the previous response.
await capture("chains", async () => {
  const chains = [];
  for (let i = 0; i < 6; i++) {
    const { data: r1, response: h1 } = await a.responses.create({ model, input: `Conversation ${i}: tell me a story about the number ${i * 7919}.`, max_output_tokens: 4 }).withResponse();
    const { data: r2, response: h2 } = await b.responses.create({
      model, previous_response_id: r1.id, max_output_tokens: 4,
      input: [{ role: "user", content: [{ type: "input_text", text: "And then?" }] }],
    }).withResponse();
    const got = await a.responses.retrieve(r2.id);
    chains.push({ first: h1.headers.get("x-kvmesh-engine"), second: h2.headers.get("x-kvmesh-engine"),
      in1: r1.usage.input_tokens, out1: r1.usage.output_tokens, in2: r2.usage.input_tokens,
      cached2: r2.usage.input_tokens_details?.cached_tokens ?? 0, retrieved: got.id === r2.id, prev: r2.previous_response_id === r1.id });
  }
  return { chains };
});

await capture("continue_empty", async () => {
  const { data: r1, response: h1 } = await a.responses.create({ model, input: "Tell me about the sea.", max_output_tokens: 4 }).withResponse();
  const { data: r2, response: h2 } = await b.responses.create({ model, previous_response_id: r1.id, input: [], max_output_tokens: 4 }).withResponse();
  return { first: h1.headers.get("x-kvmesh-engine"), second: h2.headers.get("x-kvmesh-engine"), in1: r1.usage.input_tokens,
    in2: r2.usage.input_tokens, prev: r2.previous_response_id === r1.id };
});

await capture("stream", async () => {
  const s = await b.responses.create({ model, input: [{ role: "user", content: "Stream me something" }], max_output_tokens: 6, stream: true });
  const types = [];
  let text = "", done = "", usage = null, id = null;
  for await (const ev of s) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.output_text.done") done = ev.text;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") { usage = ev.response.usage; id = ev.response.id; }
  }
  return { types, text, done, usage, id };
});

await capture("unknown_previous", () => a.responses.create({ model, input: "x", previous_response_id: "resp_kvm0000000000000000ffffffffffffffffffffffffffffffff" }));
await capture("retrieve_unknown", () => b.responses.retrieve("resp_nothere"));
await capture("bad_input", () => a.responses.create({ model, input: [{ type: "message", content: "no role" }] }));

done();
