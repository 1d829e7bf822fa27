// Shared by the client scripts: the environment the Go tests set, and
// capture(name, fn), which records fn's result, or the error any of the
// clients throws (OpenAI's, Anthropic's, the AI SDK's), under name; done()
// prints every record as one JSON object.
export const env = {
  baseURL: process.env.KVMESH_BASE_URL,
  apiKey: process.env.KVMESH_API_KEY,
  model: process.env.KVMESH_MODEL,
};

const out = {};

export async function capture(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = {
      error: true,
      status: e.statusCode ?? e.status ?? null,
      type: e.error?.error?.type ?? e.type ?? null, // Anthropic's error body, then OpenAI's
      code: e.code ?? null,
      message: String(e.message).slice(0, 500),
      name: e.constructor?.name,
    };
  }
}

export function done() {
  process.stdout.write(JSON.stringify(out));
}
