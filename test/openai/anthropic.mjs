// Driven by anthropic_test.go: the ingress through Anthropic's official
// TypeScript SDK, as Claude Code and Anthropic-API applications call a vLLM
// server (its /v1/messages); prints one JSON object.
import Anthropic from "@anthropic-ai/sdk";

import { env, capture, done } from "./harness.mjs";

const { baseURL, apiKey, model } = env; // baseURL without /v1: the SDK adds it

const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const system = [{ type: "text", text: "You are a terse assistant that answers questions about the weather in European cities." }];
const turn1 = [{ role: "user", content: "What is the weather like in Rome in spring?" }];

await capture("create", async () => {
  const m = await client.messages.create({ model, max_tokens: 7, system, messages: turn1 });
  return { type: m.type, role: m.role, text: m.content.map((b) => b.text ?? "").join(""), blocks: m.content.map((b) => b.type), stop: m.stop_reason, usage: m.usage };
});

await capture("stream", async () => {
  const s = client.messages.stream({ model, max_tokens: 5, system, messages: turn1 });
  const events = [];
  let text = "";
  s.on("streamEvent", (e) => events.push(e.type));
  s.on("text", (t) => { text += t; });
  const final = await s.finalMessage();
  return { events, text, stop: final.stop_reason, usage: final.usage };
});

await capture("tools", async () => {
  const tools = [{ name: "get_weather", description: "Current weather of a city.", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
  const m = await client.messages.create({
    model, max_tokens: 4, system, tools,
    messages: [
      ...turn1,
      { role: "assistant", content: [{ type: "text", text: "Let me check." }, { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Rome" } }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_01", content: "21 C, sunny" }] },
    ],
  });
  return { text: m.content.map((b) => b.text ?? "").join(""), usage: m.usage };
});

await capture("models", async () => {
  const page = await client.models.list();
  return { ids: page.data.map((m) => m.id) };
});

// The key as x-api-key, as earlier SDKs, Claude Code and Anthropic's API
// reference send it (this SDK version sends Authorization: Bearer), to
// /v1/models.
const xApiKey = new Anthropic({ baseURL, apiKey: null, authToken: null, defaultHeaders: { "x-api-key": apiKey }, maxRetries: 0 });
await capture("models_x_api_key", async () => {
  const page = await xApiKey.models.list();
  return { ids: page.data.map((m) => m.id) };
});

await capture("no_max_tokens", () => client.messages.create({ model, system, messages: turn1 }));

await capture("wrong_key", () => new Anthropic({ baseURL, apiKey: "wrong-key-0000", maxRetries: 0 }).messages.create({ model, max_tokens: 3, messages: turn1 }));

done();
