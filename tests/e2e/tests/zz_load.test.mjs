// Load: many concurrent streaming requests on the CPU. All must complete with no error, greedy
// outputs under load must equal the same requests run alone, and afterwards no KV block may stay
// in use. Sizes: SPECULA_E2E_LOAD_REQUESTS (256), SPECULA_E2E_LOAD_PROMPTS (16 distinct prompts,
// so identical prompts also meet in the prefix cache), SPECULA_E2E_LOAD_TOKENS (32 per request).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { MODEL, client, metrics, sample, waitIdle } from './common.mjs';

const REQUESTS = Number(process.env.SPECULA_E2E_LOAD_REQUESTS ?? 256);
const PROMPTS = Number(process.env.SPECULA_E2E_LOAD_PROMPTS ?? 16);
const TOKENS = Number(process.env.SPECULA_E2E_LOAD_TOKENS ?? 32);

const prompt = (i) => `Request ${i}: write one line about the number ${i * 7 + 3} and the color ${
  ['red', 'green', 'blue', 'amber'][i % 4]}.`;

async function streamOne(i) {
  const stream = await client.completions.create({
    model: MODEL, prompt: prompt(i), max_tokens: TOKENS, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, usage, finish };
}

test(`${REQUESTS} concurrent streams complete, match their solo outputs, and leak no blocks`, { timeout: 600_000 },
  async (t) => {
    const solo = [];
    for (let i = 0; i < PROMPTS; ++i) solo.push(await streamOne(i));
    const start = Date.now();
    const results = await Promise.allSettled(Array.from({ length: REQUESTS }, (_, k) => streamOne(k % PROMPTS)));
    const seconds = (Date.now() - start) / 1000;
    const errors = results.filter((r) => r.status === 'rejected');
    const tokens = results.reduce((n, r) => n + (r.value?.usage?.completion_tokens ?? 0), 0);
    const summary = `load test: ${REQUESTS} concurrent streaming requests (${PROMPTS} distinct prompts, ` +
      `${TOKENS} tokens each), ${tokens} tokens in ${seconds.toFixed(1)} s = ${(tokens / seconds).toFixed(1)} ` +
      `tokens/s, errors: ${errors.length}`;
    t.diagnostic(summary);
    console.log(summary);
    if (process.env.SPECULA_E2E_REPORT) writeFileSync(process.env.SPECULA_E2E_REPORT, `${summary}\n`);

    assert.equal(errors.length, 0, errors.map((e) => String(e.reason)).slice(0, 3).join('; '));
    assert.equal(tokens, REQUESTS * TOKENS);
    results.forEach((r, k) => {
      assert.equal(r.value.finish, 'length', `request ${k}`);
      assert.equal(r.value.text, solo[k % PROMPTS].text, `request ${k}: output under load differs from solo run`);
    });

    const m = await waitIdle(60_000);
    assert.equal(sample(m, 'vllm:num_requests_running'), 0);
    assert.equal(sample(m, 'vllm:num_requests_waiting'), 0);
    assert.equal(sample(m, 'vllm:kv_cache_usage_perc'), 0, 'KV blocks still in use after every request finished');
    // Identical prompts met in the prefix cache.
    assert.ok((sample(m, 'vllm:prefix_cache_hits_total') ?? 0) > 0, 'no prefix cache hits');
  });
