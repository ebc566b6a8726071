// The non-OpenAI endpoints in vLLM's shapes, over plain HTTP.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, MODEL, client, maxModelLen, metrics, postJson, sample } from './common.mjs';

test('GET /health answers 200 without a key, /version answers', async () => {
  const health = await fetch(`${BASE}/health`);
  assert.equal(health.status, 200);
  const version = await (await fetch(`${BASE}/version`)).json();
  assert.equal(typeof version.version, 'string');
});

test('/tokenize and /detokenize round-trip, and chat tokenization matches the prompt usage', async () => {
  const len = await maxModelLen();
  const t = await postJson('/tokenize', { model: MODEL, prompt: 'Hello, world!' });
  assert.equal(t.status, 200);
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(t.json.max_model_len, len);
  const plain = await postJson('/tokenize', { model: MODEL, prompt: 'Hello, world!', add_special_tokens: false });
  const d = await postJson('/detokenize', { model: MODEL, tokens: plain.json.tokens });
  assert.equal(d.status, 200);
  assert.equal(d.json.prompt, 'Hello, world!');

  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }];
  const chatTokens = await postJson('/tokenize', { model: MODEL, messages, add_generation_prompt: true });
  assert.equal(chatTokens.status, 200);
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 1 });
  assert.equal(chatTokens.json.count, r.usage.prompt_tokens);
  assert.equal((await postJson('/detokenize', { model: MODEL, tokens: [-1] })).status, 400);
});

test('/metrics speaks Prometheus with vLLM names and counts requests', async () => {
  const before = await metrics();
  const r = await client.completions.create({ model: MODEL, prompt: 'Count me', max_tokens: 4, temperature: 0,
    ignore_eos: true });
  assert.equal(r.choices[0].finish_reason, 'length');
  const after = await metrics();
  for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
    'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:request_success_total',
    'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total', 'vllm:num_preemptions_total',
    'vllm:time_to_first_token_seconds', 'vllm:time_per_output_token_seconds', 'vllm:e2e_request_latency_seconds',
    'vllm:request_prompt_tokens', 'vllm:request_generation_tokens']) {
    assert.match(after.text, new RegExp(`# TYPE ${name} `), name);
  }
  assert.match(after.text, new RegExp(`model_name="${MODEL}"`));
  const count = (m, name) => sample(m, name, '') ?? 0;
  assert.equal(sample(after, 'vllm:request_success_total', 'finished_reason="length"'),
    (sample(before, 'vllm:request_success_total', 'finished_reason="length"') ?? 0) + 1);
  assert.equal(count(after, 'vllm:time_to_first_token_seconds_count'),
    count(before, 'vllm:time_to_first_token_seconds_count') + 1);
  assert.ok(count(after, 'vllm:generation_tokens_total') >= count(before, 'vllm:generation_tokens_total') + 4);
  assert.ok(count(after, 'vllm:prompt_tokens_total') > count(before, 'vllm:prompt_tokens_total'));
});
