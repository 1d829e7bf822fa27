// Driven by security_test.go: one completion per bearer token through the
// official client over HTTPS (the CA comes from NODE_EXTRA_CA_CERTS), printing
// what each call saw as one JSON object.
import OpenAI from "openai";

const tokens = JSON.parse(process.env.KVMESH_TOKENS);
const out = {};
for (const [name, token] of Object.entries(tokens)) {
  const client = new OpenAI({ baseURL: process.env.KVMESH_BASE_URL, apiKey: token, maxRetries: 0, timeout: 30000 });
  try {
    const r = await client.completions.create({ model: process.env.KVMESH_MODEL, prompt: "hello", max_tokens: 2 });
    out[name] = { ok: true, finish: r.choices[0].finish_reason };
  } catch (e) {
    out[name] = { ok: false, status: e.status ?? null, type: e.type ?? null, message: String(e.message) };
  }
}
process.stdout.write(JSON.stringify(out));
