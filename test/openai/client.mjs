// Driven by openai_test.go: runs every check against the ingress with the
// official client and prints one JSON object with what it saw.
import OpenAI from "openai";
import { env, capture, done } from "./harness.mjs";

const base = env.baseURL;
const client = new OpenAI({ baseURL: base, apiKey: env.apiKey, maxRetries: 0, timeout: 30000 });
const model = env.model;

await capture("models", async () => {
  const list = await client.models.list();
  return { ids: list.data.map((m) => m.id) };
});

await capture("model_retrieve", async () => {
  const m = await client.models.retrieve(model);
  return { id: m.id, object: m.object };
});

await capture("completion", async () => {
  const r = await client.completions.create({ model, prompt: "The quick brown fox", max_tokens: 8 });
  return { object: r.object, text: r.choices[0].text, finish: r.choices[0].finish_reason, usage: r.usage };
});

await capture("completion_ids", async () => {
  const r = await client.completions.create({ model, prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], max_tokens: 4 });
  return { text: r.choices[0].text, usage: r.usage };
});

await capture("completion_stream", async () => {
  const s = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 6, stream: true, stream_options: { include_usage: true } });
  let text = "", chunks = 0, usage = null, finish = null;
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) { text += ch.text ?? ""; if (ch.finish_reason) finish = ch.finish_reason; }
  }
  return { text, chunks, usage, finish };
});

await capture("completion_batch", async () => {
  const r = await client.completions.create({ model, prompt: [[1, 2, 3, 4, 5], [6, 7, 8]], max_tokens: 3 });
  return { indexes: r.choices.map((c) => c.index), usage: r.usage };
});

await capture("completion_batch_stream", async () => {
  const s = await client.completions.create({ model, prompt: ["First prompt", "Second prompt"], max_tokens: 4, stream: true, stream_options: { include_usage: true } });
  const finished = {};
  let usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) if (ch.finish_reason) finished[ch.index] = ch.finish_reason;
  }
  return { finished: Object.keys(finished).sort(), usage };
});

const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Say hello." },
];

await capture("chat", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 7 });
  return { object: r.object, role: r.choices[0].message.role, content: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
});

await capture("chat_stream", async () => {
  const s = await client.chat.completions.create({ model, messages, max_tokens: 5, stream: true, stream_options: { include_usage: true } });
  let content = "", chunks = 0, usage = null, role = null, finish = null;
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      if (ch.delta?.role) role = ch.delta.role;
      content += ch.delta?.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, chunks, usage, role, finish };
});

await capture("completion_stop_ids", async () => {
  // vLLM's extra fields, sent as they are: the output ends on a stop token id.
  const whole = await client.completions.create({ model, prompt: "Count with me", max_tokens: 10, return_token_ids: true });
  const ids = whole.choices[0].token_ids;
  let k = 3;
  while (k < ids.length && ids.indexOf(ids[k]) !== k) k++;
  const r = await client.completions.create({ model, prompt: "Count with me", max_tokens: 10, return_token_ids: true, stop_token_ids: [ids[k]] });
  return { ids, k, got: r.choices[0].token_ids, finish: r.choices[0].finish_reason, stopReason: r.choices[0].stop_reason, usage: r.usage };
});

await capture("chat_usage_continuous", async () => {
  const s = await client.chat.completions.create({ model, messages, max_tokens: 6, n: 2, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true } });
  let chunks = 0, withUsage = 0, last = null;
  const perChoice = {};
  for await (const c of s) {
    chunks++;
    if (c.usage) withUsage++;
    if (c.choices?.length) perChoice[c.choices[0].index] = c.usage?.completion_tokens;
    else last = c.usage;
  }
  return { chunks, withUsage, perChoice, last };
});

await capture("chat_stop", async () => {
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 12 });
  const stop = whole.choices[0].message.content.trim().split(/\s+/)[3];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 12, stop: [stop] });
  const s = await client.chat.completions.create({ model, messages, max_tokens: 12, stop, stream: true });
  let streamed = "", finish = null;
  for await (const c of s) {
    streamed += c.choices[0]?.delta?.content ?? "";
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  }
  return { whole: whole.choices[0].message.content, stop, text: r.choices[0].message.content, finish: r.choices[0].finish_reason,
    stopReason: r.choices[0].stop_reason, streamed, streamFinish: finish };
});

await capture("chat_n_stream", async () => {
  const s = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2, stream: true, stream_options: { include_usage: true } });
  const content = {}, finish = {};
  let usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      content[ch.index] = (content[ch.index] ?? "") + (ch.delta?.content ?? "");
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2 });
  return { content, finish, usage, full: r.choices.map((c) => c.message.content), fullIndexes: r.choices.map((c) => c.index), fullUsage: r.usage };
});

await capture("unknown_model", () => client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 }));

await capture("bad_request", () => client.completions.create({ model, prompt: [-1], max_tokens: 1 }));

await capture("wrong_key", () => new OpenAI({ baseURL: base, apiKey: "wrong-key-0000", maxRetries: 0 }).models.list().then(() =>
  new OpenAI({ baseURL: base, apiKey: "wrong-key-0000", maxRetries: 0 }).completions.create({ model, prompt: "x", max_tokens: 1 })));

done();
