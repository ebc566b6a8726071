// Shared by the end-to-end tests: where the server is (run.sh exports these) and a client for it.
import OpenAI from 'openai';

export const BASE = process.env.SPECULA_E2E_URL ?? 'http://127.0.0.1:8000';
export const API_KEY = process.env.SPECULA_E2E_API_KEY ?? 'e2e-key';
export const MODEL = process.env.SPECULA_E2E_MODEL_NAME ?? 'specula-e2e';

export const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 600_000 });

export const auth = { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' };

export async function postJson(path, body, headers = auth) {
  const res = await fetch(`${BASE}${path}`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}

// Parsed Prometheus samples: "name{labels}" -> value.
export async function metrics() {
  const res = await fetch(`${BASE}/metrics`);
  const text = await res.text();
  const samples = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    samples.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return { text, samples };
}

// The value of a metric whose labels include `labelSubstring` (e.g. 'finished_reason="stop"').
export function sample(m, name, labelSubstring = '') {
  for (const [key, value] of m.samples) {
    if ((key === name || key.startsWith(`${name}{`)) && key.includes(labelSubstring)) return value;
  }
  return undefined;
}

export async function maxModelLen() {
  const models = await client.models.list();
  return models.data[0].max_model_len;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Waits until the engine is idle (nothing running or waiting); returns the last metrics.
export async function waitIdle(timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await metrics();
    const running = sample(m, 'vllm:num_requests_running');
    const waiting = sample(m, 'vllm:num_requests_waiting');
    if ((running === 0 && waiting === 0) || Date.now() > deadline) return m;
    await sleep(100);
  }
}
