// The served greedy text equals transformers' continuation of the committed reference fixture
// (tests/fixtures/embedded/<model>/reference.safetensors: I32 tensors prompt_i, greedy_i, and the
// prompts' text in the metadata), for prompts given as token ids and as text. run.sh points
// SPECULA_E2E_REFERENCE at the fixture of the model it serves, and runs the suite once without and
// once with speculative decoding (SPECULA_E2E_SPECULATIVE=1); with it, drafts must have been made
// and accepted, so that the comparison really went through verification.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { MODEL, client, metrics, postJson, sample, waitIdle } from './common.mjs';

const FILE = process.env.SPECULA_E2E_REFERENCE;
const SPECULATIVE = process.env.SPECULA_E2E_SPECULATIVE === '1';

// safetensors: an 8-byte little-endian header length, the JSON header, then the tensors' bytes.
function readReference(file) {
  const buf = readFileSync(file);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const tensor = (name) => {
    const t = header[name];
    assert.equal(t.dtype, 'I32', `${name} is ${t.dtype}`);
    const [begin, end] = t.data_offsets;
    const out = [];
    for (let at = 8 + headerLen + begin; at < 8 + headerLen + end; at += 4) out.push(buf.readInt32LE(at));
    return out;
  };
  const cases = [];
  for (let i = 0; header[`prompt_${i}`]; ++i) {
    cases.push({ prompt: tensor(`prompt_${i}`), greedy: tensor(`greedy_${i}`), text: header.__metadata__?.[`prompt_${i}_text`] });
  }
  return cases;
}

test('greedy completions equal the transformers reference', { skip: !FILE && 'SPECULA_E2E_REFERENCE not set' }, async () => {
  const cases = readReference(FILE);
  assert.ok(cases.length >= 2, `${FILE}: ${cases.length} prompts`);
  const before = SPECULATIVE ? await metrics() : null;
  for (const [i, c] of cases.entries()) {
    const expected = await postJson('/detokenize', { model: MODEL, tokens: c.greedy });
    assert.equal(expected.status, 200, expected.text);
    const want = expected.json.prompt;
    assert.ok(want.length > 0);
    const params = { model: MODEL, max_tokens: c.greedy.length, temperature: 0, ignore_eos: true };
    const byIds = await client.completions.create({ ...params, prompt: c.prompt });
    assert.equal(byIds.choices[0].text, want, `prompt ${i} as token ids`);
    assert.equal(byIds.usage.completion_tokens, c.greedy.length);
    // The prompt's text encodes to the same ids (the fixture was made from it), so it continues alike.
    if (c.text !== undefined) {
      const tok = await postJson('/tokenize', { model: MODEL, prompt: c.text, add_special_tokens: false });
      assert.equal(tok.status, 200, tok.text);
      assert.deepEqual(tok.json.tokens, c.prompt, `prompt ${i}'s text tokenizes differently`);
      const byText = await client.completions.create({ ...params, prompt: c.text });
      assert.equal(byText.choices[0].text, want, `prompt ${i} as text`);
    }
  }
  if (SPECULATIVE) {
    const after = await waitIdle();
    const drafts = sample(after, 'vllm:spec_decode_num_draft_tokens_total') - (sample(before, 'vllm:spec_decode_num_draft_tokens_total') ?? 0);
    const accepted = sample(after, 'vllm:spec_decode_num_accepted_tokens_total') - (sample(before, 'vllm:spec_decode_num_accepted_tokens_total') ?? 0);
    assert.ok(drafts > 0, `no drafts were verified (${drafts})`);
    assert.ok(accepted > 0, `no draft was accepted (${accepted} of ${drafts})`);
  }
});
