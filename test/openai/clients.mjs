// Driven by clients_test.go: the ingress through other popular clients —
// the Vercel AI SDK (whose default OpenAI model speaks the Responses API)
// and LangChain — as their users call them; prints one JSON object.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";
import { ChatOpenAI } from "@langchain/openai";

import { env, capture, done } from "./harness.mjs";

const { baseURL, apiKey, model } = env;

const sdk = createOpenAI({ baseURL, apiKey });
const usageOf = (u) => ({ input: u?.inputTokens ?? null, output: u?.outputTokens ?? null });

await capture("aisdk_responses", async () => {
  const r = await generateText({ model: sdk(model), system: "Be brief.", prompt: "Hello", maxOutputTokens: 8, maxRetries: 0 });
  return { text: r.text, usage: usageOf(r.usage) };
});
await capture("aisdk_responses_stream", async () => {
  const r = streamText({ model: sdk(model), messages: [{ role: "user", content: "Hi" }], maxOutputTokens: 6, maxRetries: 0 });
  let text = "";
  for await (const d of r.textStream) text += d;
  return { text, usage: usageOf(await r.usage), finish: await r.finishReason };
});
await capture("aisdk_chat", async () => {
  const r = await generateText({ model: sdk.chat(model), prompt: "Hello", maxOutputTokens: 7, maxRetries: 0 });
  return { text: r.text, usage: usageOf(r.usage) };
});
await capture("aisdk_chat_stream", async () => {
  const r = streamText({ model: sdk.chat(model), system: "s", prompt: "Hi", maxOutputTokens: 5, maxRetries: 0 });
  let text = "";
  for await (const d of r.textStream) text += d;
  return { text, usage: usageOf(await r.usage) };
});
await capture("aisdk_completion", async () => {
  const r = await generateText({ model: sdk.completion(model), prompt: "Once upon a time", maxOutputTokens: 4, maxRetries: 0 });
  return { text: r.text, usage: usageOf(r.usage) };
});

const lc = (extra) => new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxRetries: 0, ...extra });
await capture("langchain_chat", async () => {
  const r = await lc({ maxTokens: 7 }).invoke([["system", "Be brief."], ["human", "hello"]]);
  return { text: r.content, usage: { input: r.usage_metadata?.input_tokens, output: r.usage_metadata?.output_tokens } };
});
await capture("langchain_stream", async () => {
  let text = "", u = null;
  for await (const c of await lc({ maxTokens: 5, streamUsage: true }).stream("hello")) {
    text += c.content;
    if (c.usage_metadata) u = c.usage_metadata;
  }
  return { text, usage: { input: u?.input_tokens, output: u?.output_tokens } };
});
await capture("langchain_responses", async () => {
  const r = await lc({ maxTokens: 6, useResponsesApi: true }).invoke("hello");
  const text = typeof r.content === "string" ? r.content : r.content.map((p) => p.text ?? "").join("");
  return { text, usage: { input: r.usage_metadata?.input_tokens, output: r.usage_metadata?.output_tokens } };
});

done();
