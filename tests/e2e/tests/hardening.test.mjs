// The findings of a hostile-client run, each as a test against the real server: JSON nested 20,000
// and 100,000 levels deep on every route, prompt_logprobs -1, a 100 MB body, clients trickling
// their headers while others are served, the API key on each route, a second server on a busy
// port, SIGTERM with streams and whole responses in flight, and 1,000 requests at concurrency 64.
// Run once (without speculation: nothing here depends on it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { BASE, MODEL, auth, client, postJson, sample, sleep, waitIdle } from './common.mjs';

const SKIP = process.env.SPECULA_E2E_SPECULATIVE === '1' && 'runs once, without speculation';
const BIN = process.env.SPECULA_E2E_BIN;
const SERVED_MODEL_DIR = process.env.SPECULA_E2E_MODEL_DIR;
const url = new URL(BASE);

async function healthy() {
  const res = await fetch(`${BASE}/health`);
  return res.status === 200;
}

test('JSON nested 20k and 100k levels deep is a 400 on every route, never a crash', { skip: SKIP }, async () => {
  for (const depth of [20_000, 100_000]) {
    const deep = '['.repeat(depth) + ']'.repeat(depth);
    const bodies = [
      ['/tokenize', `{"model": "${MODEL}", "prompt": "x", "extra": ${deep}}`],
      ['/tokenize', `{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"k": ${deep}}}`],
      ['/detokenize', `{"tokens": ${deep}}`],
      ['/v1/completions', `{"model": "${MODEL}", "prompt": "x", "max_tokens": 2, "extra": ${deep}}`],
      ['/v1/chat/completions', `{"model": "${MODEL}", "messages": [{"role": "user", "content": "hi", "x": ${deep}}]}`],
      ['/v1/chat/completions', `{"model": "${MODEL}", "messages": [{"role": "user", "content": "hi"}], "tools": ${deep}}`],
    ];
    for (const [path, body] of bodies) {
      const r = await postJson(path, body);
      assert.equal(r.status, 400, `${path} depth ${depth}: ${r.text.slice(0, 200)}`);
      assert.match(r.json.error.message, /nested deeper than/);
    }
  }
  assert.ok(await healthy());
});

test('prompt_logprobs -1 is refused under --max-logprobs', { skip: SKIP }, async () => {
  const r = await postJson('/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 2, prompt_logprobs: -1 });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'prompt_logprobs');
});

test('a 100 MB body is refused without being read', { skip: SKIP }, async () => {
  const body = JSON.stringify({ prompt: 'a'.repeat(100 << 20) });
  let status = null;
  try {
    const res = await fetch(`${BASE}/tokenize`, { method: 'POST', headers: auth, body });
    status = res.status;
  } catch {
    status = 'closed';  // the server may close the connection before the client has sent it all
  }
  assert.ok(status === 413 || status === 'closed', `status ${status}`);
  assert.ok(await healthy());
});

test('20 clients trickling their headers do not stop others from being served', { skip: SKIP }, async () => {
  const sockets = [];
  for (let i = 0; i < 20; ++i) {
    const s = net.connect(Number(url.port), url.hostname);
    s.on('error', () => {});
    s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
    sockets.push(s);
  }
  const trickle = setInterval(() => sockets.forEach((s) => s.write('X')), 200);
  try {
    const replies = await Promise.all(Array.from({ length: 10 }, (_, i) =>
      client.completions.create({ model: MODEL, prompt: `def f${i}(x):`, max_tokens: 4, temperature: 0 })));
    replies.forEach((r) => assert.equal(r.choices[0].finish_reason, 'length'));
  } finally {
    clearInterval(trickle);
    sockets.forEach((s) => s.destroy());
  }
});

test('the API key guards /v1 and the tokenizer routes; probes stay open', { skip: SKIP }, async () => {
  const open = { 'Content-Type': 'application/json' };
  for (const [path, body] of [['/v1/completions', { prompt: 'x' }], ['/v1/chat/completions', { messages: [] }],
    ['/tokenize', { prompt: 'x' }], ['/detokenize', { tokens: [1] }]]) {
    assert.equal((await postJson(path, body, open)).status, 401, path);
    assert.equal((await postJson(path, body, { ...open, Authorization: 'Bearer wrong' })).status, 401, path);
  }
  assert.equal((await fetch(`${BASE}/v1/models`)).status, 401);
  const lower = { ...auth, Authorization: auth.Authorization.replace('Bearer', 'bearer') };
  assert.equal((await postJson('/tokenize', { prompt: 'x' }, lower)).status, 200);
  for (const path of ['/health', '/version', '/metrics']) assert.equal((await fetch(`${BASE}${path}`)).status, 200, path);
});

// A second `specula serve` of its own: started on the busy port it must fail; on a free port it
// is stopped with SIGTERM while a stream and a whole response are in flight.
function startServer(port, extra = []) {
  const proc = spawn(BIN, ['serve', SERVED_MODEL_DIR, '--host', '127.0.0.1', '--port', String(port), '--device', 'cpu',
    '--max-model-len', '1024', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
  return { proc, exited, log: () => log };
}

test('a second server on a busy port fails to start', { skip: SKIP || (!BIN && 'SPECULA_E2E_BIN not set') }, async () => {
  const s = startServer(Number(url.port));
  const code = await Promise.race([s.exited, sleep(120_000).then(() => 'running')]);
  if (code === 'running') s.proc.kill('SIGKILL');
  assert.notEqual(code, 0, s.log());
  assert.notEqual(code, 'running', 'the second server kept running on a busy port');
  assert.match(s.log(), /cannot listen on 127\.0\.0\.1/);
});

test('SIGTERM: streams end with an error event and [DONE], whole responses with 503, exit 0',
  { skip: SKIP || (!BIN && 'SPECULA_E2E_BIN not set'), timeout: 180_000 }, async () => {
    const port = await new Promise((resolve) => {
      const srv = net.createServer().listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)); });
    });
    const s = startServer(port, ['--shutdown-timeout', '0.5']);
    const base = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 240; ++i) {
      try { if ((await fetch(`${base}/health`)).status === 200) break; } catch { /* not up yet */ }
      await sleep(500);
    }
    const long = { prompt: 'def fib(n):', max_tokens: 900, ignore_eos: true, temperature: 0 };
    const streamRes = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...long, stream: true }) });
    const whole = fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(long) });
    const reader = streamRes.body.getReader();
    let text = '';
    const first = await reader.read();  // generation is under way
    text += new TextDecoder().decode(first.value);
    await sleep(200);
    s.proc.kill('SIGTERM');
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    assert.match(text, /"code":503/);
    assert.match(text, /data: \[DONE\]\n\n$/);
    const res = await whole;
    assert.equal(res.status, 503);
    assert.match(await res.text(), /shutting down/);
    const code = await Promise.race([s.exited, sleep(30_000).then(() => 'running')]);
    assert.equal(code, 0, s.log().slice(-2000));
  });

test('1,000 requests at concurrency 64: no failure, no KV block left', { skip: SKIP, timeout: 600_000 }, async () => {
  let next = 0;
  let failures = 0;
  const worker = async () => {
    while (next < 1000) {
      const i = next++;
      try {
        const r = await client.completions.create({ model: MODEL, prompt: `item ${i}:`, max_tokens: 4, temperature: 0 });
        if (r.choices[0].text === undefined) failures += 1;
      } catch (e) {
        failures += 1;
        if (failures < 4) console.error(`request ${i}: ${e}`);
      }
    }
  };
  await Promise.all(Array.from({ length: 64 }, worker));
  assert.equal(failures, 0);
  const m = await waitIdle(60_000);
  assert.equal(sample(m, 'vllm:num_requests_running'), 0);
  assert.equal(sample(m, 'vllm:kv_cache_usage_perc'), 0);
});
