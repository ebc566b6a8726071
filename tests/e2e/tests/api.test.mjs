// The OpenAI API through the official client: shapes, streaming, n, seed, stop, logprobs, usage,
// and the typed errors a client sees for bad requests.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { BASE, MODEL, client, maxModelLen, postJson, metrics, sample, waitIdle } from './common.mjs';

const messages = [{ role: 'user', content: 'Tell me a short story about a cat.' }];

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

test('GET /v1/models lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
  assert.equal(models.data[0].object, 'model');
  assert.equal(models.data[0].owned_by, 'specula');
  assert.ok(models.data[0].max_model_len > 0);
});

test('chat completion has OpenAI shape and usage', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('chat stream: role chunk, deltas equal to the non-streamed greedy reply, finish, usage last', async () => {
  const params = { model: MODEL, messages, max_tokens: 12, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(params);
  const chunks = await collect(await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(chunks[0].object, 'chat.completion.chunk');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.ok(chunks.every((c) => c.id === chunks[0].id));
  const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? '')).join('');
  assert.equal(text, whole.choices[0].message.content);
  const finishes = chunks.flatMap((c) => c.choices.filter((ch) => ch.finish_reason).map((ch) => ch.finish_reason));
  assert.deepEqual(finishes, ['length']);
  const last = chunks.at(-1);
  assert.equal(last.choices.length, 0);
  assert.deepEqual(last.usage, whole.usage);
  assert.equal(whole.usage.completion_tokens, 12);
});

test('completions: strings, token ids, several prompts with n, and their indices', async () => {
  const prompts = ['Once upon a time', 'The sky is'];
  const r = await client.completions.create({ model: MODEL, prompt: prompts, n: 2, max_tokens: 5, temperature: 0,
    ignore_eos: true });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  // Greedy: both choices of a prompt agree; each equals that prompt run on its own.
  assert.equal(r.choices[0].text, r.choices[1].text);
  assert.equal(r.choices[2].text, r.choices[3].text);
  for (const [i, prompt] of prompts.entries()) {
    const single = await client.completions.create({ model: MODEL, prompt, max_tokens: 5, temperature: 0, ignore_eos: true });
    assert.equal(single.choices[0].text, r.choices[2 * i].text);
    const tokens = (await postJson('/tokenize', { model: MODEL, prompt })).json.tokens;
    const byIds = await client.completions.create({ model: MODEL, prompt: tokens, max_tokens: 5, temperature: 0,
      ignore_eos: true });
    assert.equal(byIds.choices[0].text, single.choices[0].text);
  }
  assert.equal(r.usage.completion_tokens, 20);
});

test('completions stream equals the non-streamed greedy text; echo prepends the prompt', async () => {
  const params = { model: MODEL, prompt: 'In a hole in the ground', max_tokens: 10, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(params);
  const chunks = await collect(await client.completions.create({ ...params, stream: true,
    stream_options: { include_usage: true } }));
  assert.equal(chunks.flatMap((c) => c.choices.map((ch) => ch.text)).join(''), whole.choices[0].text);
  assert.equal(chunks.at(-1).usage.completion_tokens, 10);
  const echoed = await client.completions.create({ ...params, echo: true });
  assert.equal(echoed.choices[0].text, params.prompt + whole.choices[0].text);
});

test('a seed makes sampling reproducible', async () => {
  const params = { model: MODEL, messages, max_tokens: 16, temperature: 1.0, ignore_eos: true };
  const a = await client.chat.completions.create({ ...params, seed: 1234 });
  const b = await client.chat.completions.create({ ...params, seed: 1234 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const others = await Promise.all([1, 2, 3, 4].map((seed) => client.chat.completions.create({ ...params, seed })));
  assert.ok(others.some((o) => o.choices[0].message.content !== a.choices[0].message.content),
    'four other seeds all gave the same sample');
});

test('n > 1 gives n choices', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, n: 3, temperature: 1.0,
    seed: 7 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(r.usage.completion_tokens >= 3);
});

test('a stop string ends the reply and is left out', async () => {
  const params = { model: MODEL, prompt: 'Once upon a time there was', max_tokens: 24, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(params)).choices[0].text;
  assert.ok(full.length >= 6, `greedy text too short to cut: ${JSON.stringify(full)}`);
  // A stop string from the middle of the greedy text (its first occurrence decides where it stops).
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
  const r = await client.completions.create({ ...params, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, stop);
});

test('logprobs in the chat and completions shapes', async () => {
  const chat = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5, temperature: 0,
    logprobs: true, top_logprobs: 3, ignore_eos: true });
  const content = chat.choices[0].logprobs.content;
  assert.equal(content.length, chat.usage.completion_tokens);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 3);
    for (let k = 1; k < 3; ++k) assert.ok(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob);
    // Greedy picks the most likely token.
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-4);
  }
  assert.equal(content.map((e) => e.token).join(''), chat.choices[0].message.content);

  const cmpl = await client.completions.create({ model: MODEL, prompt: 'The sky is', max_tokens: 5, temperature: 0,
    logprobs: 2, ignore_eos: true });
  const lp = cmpl.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  assert.equal(lp.top_logprobs.length, 5);
  assert.equal(lp.tokens.join(''), cmpl.choices[0].text);
  for (let i = 1; i < 5; ++i) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
  for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
});

test('bad requests raise the client\'s typed errors', async () => {
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages, temperature: -1 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, 'temperature');
    return true;
  });
  const len = await maxModelLen();
  await assert.rejects(client.completions.create({ model: MODEL, prompt: 'hello', max_tokens: len + 10 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, new RegExp(`${len}`));
    assert.match(e.message, new RegExp(`${len + 10}`));
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.status, 404);
    return true;
  });
  const wrongKey = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const malformed = await postJson('/v1/chat/completions', '{"messages": [');
  assert.equal(malformed.status, 400);
  assert.equal(malformed.json.error.type, 'BadRequestError');
  const wrongType = await postJson('/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 'ten' });
  assert.equal(wrongType.status, 400);
  assert.equal(wrongType.json.error.param, 'max_tokens');
  const unknown = await fetch(`${BASE}/v1/nowhere`, { headers: { Authorization: `Bearer ${process.env.SPECULA_E2E_API_KEY ?? 'e2e-key'}` } });
  assert.equal(unknown.status, 404);
});

test('a client that goes away mid-stream frees its request', async () => {
  const abortsBefore = sample(await metrics(), 'vllm:request_success_total', 'finished_reason="abort"');
  const controller = new AbortController();
  // No max_tokens: it would run to max_model_len.
  const stream = await client.chat.completions.create(
    { model: MODEL, messages, temperature: 0, ignore_eos: true, stream: true },
    { signal: controller.signal });
  let seen = 0;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) seen += 1;
    if (seen >= 2) {
      controller.abort();  // hang up: the connection closes under the server
      break;
    }
  }
  assert.equal(seen, 2);
  const m = await waitIdle(30_000);
  assert.equal(sample(m, 'vllm:num_requests_running'), 0);
  assert.equal(sample(m, 'vllm:kv_cache_usage_perc'), 0);
  assert.equal(sample(m, 'vllm:request_success_total', 'finished_reason="abort"'), abortsBefore + 1);
});
