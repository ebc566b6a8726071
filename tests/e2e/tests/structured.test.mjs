// Structured outputs and tool calling through the clients people use: the openai SDK (response_format,
// vLLM's structured_outputs, tools and tool_choice, streamed tool-call deltas), the Vercel AI SDK
// (ai + @ai-sdk/openai-compatible) and LangChain (@langchain/openai). The embedded tiny model writes
// nonsense, so the constraint does all the work: every schema is bounded (maxLength, enums, integer
// ranges, maxItems) so that a constrained reply ends well inside max_tokens, and every reply is
// checked against its schema with zod (strict objects: no extra keys).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { generateObject, generateText, streamObject, streamText, Output, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { BASE, API_KEY, MODEL, client, metrics, sample, waitIdle } from './common.mjs';

const SPECULATIVE = process.env.SPECULA_E2E_SPECULATIVE === '1';
// run.sh's folder shared by its suites: the suite without speculation records its greedy
// constrained outputs there, the speculative suites must reproduce them.
const GREEDY_DIR = process.env.SPECULA_E2E_GREEDY_DIR;

// JSON allows any amount of whitespace between tokens and a sampled tiny model writes plenty
// (the server allows up to 20 characters per gap), so even a small object can take a few hundred
// tokens.
const MAX_TOKENS = 500;
// Greedy, then sampled with a seed (reproducible for a given server configuration).
const SAMPLINGS = [{ temperature: 0 }, { temperature: 1, seed: 11 }];
const label = (s) => (s.temperature === 0 ? 'greedy' : `temperature ${s.temperature}, seed ${s.seed}`);

// Server bug (found by this file): tool_choice "required" is a 400 for any tools, because
// required_tool_calls_schema (src/server/tool_choice.cc) puts "type": "object" beside "anyOf" in
// "items", which the JSON-schema compiler (src/structured_output/json_schema_to_grammar.cc) rejects:
// "the keyword 'type' alongside 'anyOf' is not supported at '#/items/type'".

// tool_choice 'required' with parallel calls allowed (the default) is an array of any number of
// calls, as in vLLM's schema; the embedded model never closes it and runs into max_tokens. Real
// models close it; with parallel_tool_calls false (one call) it passes here.
const PARALLEL_OPEN = "the embedded model keeps appending parallel tool calls until max_tokens";

// ---- schemas: the JSON Schema sent, and an independent zod schema the reply must satisfy ----

const personJsonSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    color: { type: 'string', enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
  },
  required: ['name', 'age', 'color', 'tags'],
  additionalProperties: false,
};
const Person = z.strictObject({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  color: z.enum(['red', 'green', 'blue']),
  tags: z.array(z.string().max(6)).max(3),
});

const weatherParams = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 10 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
  },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const WeatherArgs = z.strictObject({ city: z.string().max(10), unit: z.enum(['celsius', 'fahrenheit']) });

const addParams = {
  type: 'object',
  properties: {
    a: { type: 'integer', minimum: 0, maximum: 99 },
    b: { type: 'integer', minimum: 0, maximum: 99 },
  },
  required: ['a', 'b'],
  additionalProperties: false,
};
const AddArgs = z.strictObject({ a: z.number().int().min(0).max(99), b: z.number().int().min(0).max(99) });

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: weatherParams } },
  { type: 'function', function: { name: 'add', description: 'Adds two numbers', parameters: addParams } },
];
const argsSchemas = { get_weather: WeatherArgs, add: AddArgs };

const toolMessages = [{ role: 'user', content: 'What is the weather in Paris, and what is 2 + 3?' }];
const personMessages = [{ role: 'user', content: 'Describe a person as JSON.' }];

// Parses `text` as JSON and checks it against the zod schema; returns the value.
function expectValid(schema, text, what = 'reply') {
  assert.equal(typeof text, 'string', `${what} is not a string: ${JSON.stringify(text)}`);
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    assert.fail(`${what} is not JSON (${e.message}): ${JSON.stringify(text)}`);
  }
  return expectValidValue(schema, value, what);
}

function expectValidValue(schema, value, what = 'value') {
  const r = schema.safeParse(value);
  assert.ok(r.success, `${what} does not match its schema: ${JSON.stringify(value)}\n${r.error?.message}`);
  return value;
}

// A chat completion's tool calls: each a function call with an id, the name of a given tool and
// arguments that are JSON matching that tool's parameters.
function expectValidToolCalls(calls, allowed = Object.keys(argsSchemas)) {
  assert.ok(Array.isArray(calls) && calls.length >= 1, `no tool calls: ${JSON.stringify(calls)}`);
  const ids = new Set();
  for (const call of calls) {
    assert.equal(call.type, 'function');
    assert.equal(typeof call.id, 'string');
    assert.ok(call.id.length > 0);
    ids.add(call.id);
    assert.ok(allowed.includes(call.function.name), `unexpected tool ${call.function.name}`);
    expectValid(argsSchemas[call.function.name], call.function.arguments, `arguments of ${call.function.name}`);
  }
  assert.equal(ids.size, calls.length, 'tool call ids are not unique');
}

// Accumulates a stream's tool-call deltas the way OpenAI clients do (by index: the first delta of a
// call carries id, type and function.name; later ones append to function.arguments).
async function accumulateStream(stream) {
  const calls = [];
  let content = '';
  const finishes = [];
  let role;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      const d = choice.delta;
      if (d.role) role = d.role;
      if (d.content) content += d.content;
      for (const tc of d.tool_calls ?? []) {
        assert.equal(typeof tc.index, 'number', `a tool-call delta without index: ${JSON.stringify(tc)}`);
        if (!calls[tc.index]) {
          assert.equal(typeof tc.id, 'string', `first delta of call ${tc.index} has no id: ${JSON.stringify(tc)}`);
          assert.equal(tc.type, 'function', `first delta of call ${tc.index} has no type: ${JSON.stringify(tc)}`);
          assert.equal(typeof tc.function?.name, 'string', `first delta of call ${tc.index} has no name`);
          calls[tc.index] = { id: tc.id, type: tc.type, function: { name: tc.function.name, arguments: '' } };
        } else {
          assert.ok(tc.id === undefined || tc.id === calls[tc.index].id, 'a later delta changed the call id');
        }
        calls[tc.index].function.arguments += tc.function?.arguments ?? '';
      }
      if (choice.finish_reason) finishes.push(choice.finish_reason);
    }
  }
  assert.ok(!calls.includes(undefined), 'tool-call indices have a gap');
  return { role, content, calls, finishes };
}

// ---- the openai SDK ----

for (const s of SAMPLINGS) {
  test(`openai: response_format json_schema (strict) gives a valid object (${label(s)})`, async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: personMessages, max_tokens: MAX_TOKENS, ...s,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: personJsonSchema } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    expectValid(Person, r.choices[0].message.content);
  });

  test(`openai: response_format json_object gives a JSON object (${label(s)})`, async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Reply in JSON.' }], max_tokens: MAX_TOKENS, ...s,
      response_format: { type: 'json_object' },
    });
    // An unbounded object may run out of tokens; the test only holds for a finished one.
    if (r.choices[0].finish_reason === 'stop') {
      const v = JSON.parse(r.choices[0].message.content);
      assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), `not an object: ${r.choices[0].message.content}`);
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.match(r.choices[0].message.content, /^\s*\{/);
    }
  });

  test(`openai: structured_outputs regex, choice and grammar (${label(s)})`, async () => {
    const regex = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'What is the date?' }], max_tokens: 50, ...s,
      structured_outputs: { regex: '[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]' },
    });
    assert.equal(regex.choices[0].finish_reason, 'stop');
    assert.match(regex.choices[0].message.content, /^[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]$/);
    const choice = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Yes or no?' }], max_tokens: 50, ...s,
      structured_outputs: { choice: ['yes', 'no', 'maybe not'] },
    });
    assert.equal(choice.choices[0].finish_reason, 'stop');
    assert.ok(['yes', 'no', 'maybe not'].includes(choice.choices[0].message.content), choice.choices[0].message.content);
    // vLLM's older name for the same thing.
    const guided = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Pick one.' }], max_tokens: 50, ...s,
      guided_choice: ['alpha', 'beta'],
    });
    assert.ok(['alpha', 'beta'].includes(guided.choices[0].message.content), guided.choices[0].message.content);
    const grammar = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'A sum?' }], max_tokens: 50, ...s,
      structured_outputs: { grammar: 'root ::= "(" num " " op " " num ")"\nnum ::= [1-9] [0-9]?\nop ::= "+" | "-"' },
    });
    assert.equal(grammar.choices[0].finish_reason, 'stop');
    assert.match(grammar.choices[0].message.content, /^\([1-9][0-9]? [+-] [1-9][0-9]?\)$/);
  });

  test(`openai: a named tool_choice gives one valid call of that tool (${label(s)})`, async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: MAX_TOKENS, ...s, tools,
      tool_choice: { type: 'function', function: { name: 'add' } },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.role, 'assistant');
    assert.ok(!c.message.content, `content beside a forced call: ${JSON.stringify(c.message.content)}`);
    assert.equal(c.message.tool_calls.length, 1);
    expectValidToolCalls(c.message.tool_calls, ['add']);
  });

  test(`openai: named tool_choice streamed adds up to the same call (${label(s)})`, async () => {
    const params = { model: MODEL, messages: toolMessages, max_tokens: MAX_TOKENS, ...s, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } };
    const whole = await client.chat.completions.create(params);
    const streamed = await accumulateStream(await client.chat.completions.create({ ...params, stream: true }));
    assert.equal(streamed.role, 'assistant');
    assert.deepEqual(streamed.finishes, ['tool_calls']);
    assert.equal(streamed.content, '');
    assert.equal(streamed.calls.length, 1);
    expectValidToolCalls(streamed.calls, ['get_weather']);
    // Same request, same seed: the streamed arguments are the whole reply's.
    assert.equal(streamed.calls[0].function.arguments, whole.choices[0].message.tool_calls[0].function.arguments);
  });

  test(`openai: tool_choice required gives valid calls (${label(s)})`, { todo: PARALLEL_OPEN }, async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: MAX_TOKENS, ...s, tools, tool_choice: 'required',
    });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    expectValidToolCalls(r.choices[0].message.tool_calls);
  });

  test(`openai: tool_choice required, parallel_tool_calls false: one valid call (${label(s)})`, async () => {
    const one = await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: MAX_TOKENS, ...s, tools, tool_choice: 'required',
      parallel_tool_calls: false,
    });
    assert.equal(one.choices[0].finish_reason, 'tool_calls');
    assert.equal(one.choices[0].message.tool_calls.length, 1);
    expectValidToolCalls(one.choices[0].message.tool_calls);
  });

  test(`openai: tool_choice required streamed (${label(s)})`, { todo: PARALLEL_OPEN }, async () => {
    const streamed = await accumulateStream(await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: MAX_TOKENS, ...s, tools, tool_choice: 'required', stream: true,
    }));
    assert.deepEqual(streamed.finishes, ['tool_calls']);
    expectValidToolCalls(streamed.calls);
  });

  test(`openai: tool_choice auto succeeds; any calls are valid (${label(s)})`, async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: 60, ...s, tools, tool_choice: 'auto',
    });
    const c = r.choices[0];
    if (c.message.tool_calls?.length) {
      assert.equal(c.finish_reason, 'tool_calls');
      expectValidToolCalls(c.message.tool_calls);
    } else {
      assert.ok(['stop', 'length'].includes(c.finish_reason));
      assert.equal(typeof c.message.content, 'string');
    }
    const streamed = await accumulateStream(await client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: 60, ...s, tools, stream: true,
    }));
    assert.equal(streamed.finishes.length, 1);
    if (streamed.calls.length) expectValidToolCalls(streamed.calls);
  });

  test(`openai: completions with structured_outputs json (${label(s)})`, async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: 'A person in JSON:', max_tokens: MAX_TOKENS, ...s,
      structured_outputs: { json: personJsonSchema },
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    expectValid(Person, r.choices[0].text);
    const streamed = [];
    for await (const chunk of await client.completions.create({
      model: MODEL, prompt: 'A person in JSON:', max_tokens: MAX_TOKENS, ...s,
      structured_outputs: { json: personJsonSchema }, stream: true,
    })) streamed.push(...chunk.choices.map((c) => c.text));
    assert.equal(streamed.join(''), r.choices[0].text);
    // vLLM's older name, with the schema as text.
    const guided = await client.completions.create({
      model: MODEL, prompt: 'A person in JSON:', max_tokens: MAX_TOKENS, ...s, guided_json: JSON.stringify(personJsonSchema),
    });
    assert.equal(guided.choices[0].text, r.choices[0].text);
  });
}

test('openai: chat.completions.parse with zodResponseFormat', async () => {
  const schema = z.object({
    title: z.string().max(16),
    rating: z.number().int().min(1).max(5),
    genre: z.enum(['drama', 'comedy', 'horror']),
  });
  for (const s of SAMPLINGS) {
    const r = await client.chat.completions.parse({
      model: MODEL, messages: [{ role: 'user', content: 'Review a film.' }], max_tokens: MAX_TOKENS, ...s,
      response_format: zodResponseFormat(schema, 'review'),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    expectValidValue(schema.strict(), r.choices[0].message.parsed, 'parsed');
    assert.deepEqual(r.choices[0].message.parsed, JSON.parse(r.choices[0].message.content));
  }
});

test('openai: json_schema greedy is reproducible and equals the streamed text', async () => {
  const params = { model: MODEL, messages: personMessages, max_tokens: MAX_TOKENS, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personJsonSchema } } };
  const a = await client.chat.completions.create(params);
  const b = await client.chat.completions.create(params);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const { content } = await accumulateStream(await client.chat.completions.create({ ...params, stream: true }));
  assert.equal(content, a.choices[0].message.content);
  expectValid(Person, content);
});

test('greedy constrained outputs are the same with and without speculation', async (t) => {
  const before = await waitIdle();
  const greedy = { model: MODEL, temperature: 0, max_tokens: MAX_TOKENS };
  const outputs = {};
  outputs.json_schema = (await client.chat.completions.create({ ...greedy, messages: personMessages,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: personJsonSchema } } }))
    .choices[0].message.content;
  expectValid(Person, outputs.json_schema);
  outputs.regex = (await client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 'Date?' }],
    structured_outputs: { regex: '[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]' } })).choices[0].message.content;
  assert.match(outputs.regex, /^[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]$/);
  const named = await client.chat.completions.create({ ...greedy, messages: toolMessages, tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  expectValidToolCalls(named.choices[0].message.tool_calls, ['get_weather']);
  outputs.named_tool = named.choices[0].message.tool_calls[0].function.arguments;
  outputs.completions_json = (await client.completions.create({ ...greedy, prompt: 'A person in JSON:',
    structured_outputs: { json: personJsonSchema } })).choices[0].text;
  expectValid(Person, outputs.completions_json);
  if (SPECULATIVE) {
    // The comparison only means something if drafts went through the grammar masks.
    const after = await waitIdle();
    const delta = (name) => sample(after, name) - (sample(before, name) ?? 0);
    assert.ok(delta('vllm:spec_decode_num_draft_tokens_total') > 0, 'no drafts were verified');
    assert.ok(delta('vllm:spec_decode_num_accepted_tokens_total') > 0, 'no draft was accepted');
  }
  if (!GREEDY_DIR) return t.skip('SPECULA_E2E_GREEDY_DIR not set');
  const file = join(GREEDY_DIR, 'structured-greedy.json');
  if (!SPECULATIVE) return writeFileSync(file, JSON.stringify(outputs, null, 1));
  if (!existsSync(file)) return t.skip('no outputs recorded without speculation');
  assert.deepEqual(outputs, JSON.parse(readFileSync(file, 'utf8')));
});

test('openai: an unsupported schema is a 400 naming the problem', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: personMessages, max_tokens: 20,
      response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'object', not: {} } } },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `not a BadRequestError: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.message, /not/);
      assert.match(e.message, /schema/i);
      return true;
    });
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: personMessages, max_tokens: 20,
      structured_outputs: { regex: '(unclosed' } }),
    (e) => e instanceof OpenAI.BadRequestError && /regex/i.test(e.message));
});

test('openai: two constraints at once are a 400 naming both', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: personMessages, max_tokens: 20,
      response_format: { type: 'json_object' }, structured_outputs: { regex: 'a+' },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `not a BadRequestError: ${e}`);
      assert.match(e.message, /response_format/);
      assert.match(e.message, /structured_outputs/);
      return true;
    });
  // A forced tool call is a constraint too.
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: 20, tools,
      tool_choice: { type: 'function', function: { name: 'add' } }, structured_outputs: { choice: ['a', 'b'] },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  // A named tool that is not among the tools.
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: toolMessages, max_tokens: 20, tools,
      tool_choice: { type: 'function', function: { name: 'no_such_tool' } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && /no_such_tool/.test(e.message));
});

// ---- the Vercel AI SDK ----

const aiProvider = createOpenAICompatible({
  name: 'specula', baseURL: `${BASE}/v1`, apiKey: API_KEY, supportsStructuredOutputs: true, includeUsage: true,
});
const aiModel = aiProvider.chatModel(MODEL);

const Recipe = z.object({
  dish: z.string().max(16),
  servings: z.number().int().min(1).max(8),
  difficulty: z.enum(['easy', 'medium', 'hard']),
  steps: z.array(z.string().max(12)).max(3),
});

const aiTools = {
  get_weather: tool({
    description: 'The weather in a city',
    inputSchema: z.object({ city: z.string().max(10), unit: z.enum(['celsius', 'fahrenheit']) }),
  }),
  add: tool({
    description: 'Adds two numbers',
    inputSchema: z.object({ a: z.number().int().min(0).max(99), b: z.number().int().min(0).max(99) }),
  }),
};

for (const s of SAMPLINGS) {
  const opts = { model: aiModel, maxOutputTokens: MAX_TOKENS, maxRetries: 0, temperature: s.temperature, seed: s.seed };

  test(`ai sdk: generateObject with a zod schema (${label(s)})`, async () => {
    const r = await generateObject({ ...opts, schema: Recipe, prompt: 'Give me a recipe.' });
    assert.equal(r.finishReason, 'stop');
    expectValidValue(Recipe.strict(), r.object, 'object');
  });

  test(`ai sdk: generateText with Output.object (${label(s)})`, async () => {
    const r = await generateText({ ...opts, output: Output.object({ schema: Recipe }), prompt: 'Give me a recipe.' });
    expectValidValue(Recipe.strict(), r.output, 'output');
  });

  test(`ai sdk: streamObject's final object is valid (${label(s)})`, async () => {
    const r = streamObject({ ...opts, schema: Recipe, prompt: 'Give me a recipe.' });
    let partials = 0;
    for await (const partial of r.partialObjectStream) {
      assert.equal(typeof partial, 'object');
      partials++;
    }
    assert.ok(partials >= 1);
    expectValidValue(Recipe.strict(), await r.object, 'object');
  });

  test(`ai sdk: streamText with Output.object (${label(s)})`, async () => {
    const r = streamText({ ...opts, output: Output.object({ schema: Recipe }), prompt: 'Give me a recipe.' });
    expectValidValue(Recipe.strict(), await r.output, 'output');
  });

  test(`ai sdk: generateText with a named tool choice (${label(s)})`, async () => {
    const r = await generateText({ ...opts, tools: aiTools, toolChoice: { type: 'tool', toolName: 'add' },
      prompt: 'What is 2 + 3?' });
    assert.equal(r.finishReason, 'tool-calls');
    assert.equal(r.toolCalls.length, 1);
    assert.equal(r.toolCalls[0].toolName, 'add');
    assert.ok(r.toolCalls[0].toolCallId);
    expectValidValue(AddArgs, r.toolCalls[0].input, 'input');
  });

  test(`ai sdk: streamText with a named tool choice (${label(s)})`, async () => {
    const r = streamText({ ...opts, tools: aiTools, toolChoice: { type: 'tool', toolName: 'get_weather' },
      prompt: 'Weather in Paris?' });
    const calls = await r.toolCalls;
    assert.equal(await r.finishReason, 'tool-calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].toolName, 'get_weather');
    expectValidValue(WeatherArgs, calls[0].input, 'input');
  });

  test(`ai sdk: generateText with toolChoice 'required' (${label(s)})`, { todo: PARALLEL_OPEN }, async () => {
    const r = await generateText({ ...opts, tools: aiTools, toolChoice: 'required',
      prompt: 'What is the weather in Paris, and what is 2 + 3?' });
    assert.equal(r.finishReason, 'tool-calls');
    assert.ok(r.toolCalls.length >= 1);
    for (const call of r.toolCalls) expectValidValue(argsSchemas[call.toolName], call.input, `${call.toolName} input`);
  });

  test(`ai sdk: generateText with toolChoice 'auto' succeeds (${label(s)})`, async () => {
    const r = await generateText({ ...opts, maxOutputTokens: 60, tools: aiTools, toolChoice: 'auto',
      prompt: 'What is the weather in Paris?' });
    for (const call of r.toolCalls) expectValidValue(argsSchemas[call.toolName], call.input, `${call.toolName} input`);
    if (r.toolCalls.length === 0) assert.equal(typeof r.text, 'string');
  });
}

// ---- LangChain ----

function chatOpenAI(s) {
  return new ChatOpenAI({
    model: MODEL, apiKey: API_KEY, configuration: { baseURL: `${BASE}/v1` }, maxRetries: 0,
    maxTokens: MAX_TOKENS, temperature: s.temperature, ...(s.seed !== undefined ? { modelKwargs: { seed: s.seed } } : {}),
  });
}

const Movie = z.object({
  title: z.string().max(16).describe('The title'),
  year: z.number().int().min(1900).max(2030),
  genre: z.enum(['drama', 'comedy', 'horror']),
});

const lcWeather = {
  name: 'get_weather',
  description: 'The weather in a city',
  schema: z.object({ city: z.string().max(10), unit: z.enum(['celsius', 'fahrenheit']) }),
};

for (const s of SAMPLINGS) {
  for (const method of ['jsonSchema', 'functionCalling', undefined]) {
    test(`langchain: withStructuredOutput (method ${method ?? 'default'}) (${label(s)})`, async () => {
      const llm = chatOpenAI(s).withStructuredOutput(Movie, { name: 'movie', ...(method ? { method } : {}) });
      const movie = await llm.invoke('Name a movie.');
      expectValidValue(Movie.strict(), movie, 'movie');
    });
  }

  test(`langchain: withStructuredOutput includeRaw keeps the message (${label(s)})`, async () => {
    const llm = chatOpenAI(s).withStructuredOutput(Movie, { name: 'movie', method: 'jsonSchema', includeRaw: true });
    const { raw, parsed } = await llm.invoke('Name a movie.');
    expectValidValue(Movie.strict(), parsed, 'parsed');
    assert.deepEqual(JSON.parse(raw.content), parsed);
  });

  test(`langchain: bindTools with a named tool_choice (${label(s)})`, async () => {
    const msg = await chatOpenAI(s).bindTools([lcWeather], { tool_choice: 'get_weather' }).invoke('Weather in Paris?');
    assert.equal(msg.tool_calls.length, 1);
    assert.equal(msg.tool_calls[0].name, 'get_weather');
    assert.ok(msg.tool_calls[0].id);
    expectValidValue(WeatherArgs, msg.tool_calls[0].args, 'args');
    assert.equal(msg.response_metadata.finish_reason, 'tool_calls');
  });

  test(`langchain: bindTools streamed with a named tool_choice (${label(s)})`, async () => {
    const stream = await chatOpenAI(s).bindTools([lcWeather], { tool_choice: 'get_weather' }).stream('Weather?');
    let full;
    for await (const chunk of stream) full = full ? full.concat(chunk) : chunk;
    assert.equal(full.tool_calls.length, 1);
    assert.equal(full.tool_calls[0].name, 'get_weather');
    expectValidValue(WeatherArgs, full.tool_calls[0].args, 'args');
  });

  for (const choice of ['any', 'required']) {
    test(`langchain: bindTools with tool_choice '${choice}' (${label(s)})`, { todo: PARALLEL_OPEN }, async () => {
      const add = { name: 'add', description: 'Adds two numbers',
        schema: z.object({ a: z.number().int().min(0).max(99), b: z.number().int().min(0).max(99) }) };
      const msg = await chatOpenAI(s).bindTools([lcWeather, add], { tool_choice: choice })
        .invoke('What is the weather in Paris, and what is 2 + 3?');
      assert.ok(msg.tool_calls.length >= 1);
      for (const call of msg.tool_calls) expectValidValue(argsSchemas[call.name], call.args, `${call.name} args`);
    });
  }

  test(`langchain: bindTools with tool_choice 'auto' succeeds (${label(s)})`, async () => {
    const llm = new ChatOpenAI({ model: MODEL, apiKey: API_KEY, configuration: { baseURL: `${BASE}/v1` },
      maxRetries: 0, maxTokens: 60, temperature: s.temperature });
    const msg = await llm.bindTools([lcWeather], { tool_choice: 'auto' }).invoke('Weather in Paris?');
    for (const call of msg.tool_calls ?? []) expectValidValue(WeatherArgs, call.args, 'args');
    if (!msg.tool_calls?.length) assert.equal(typeof msg.content, 'string');
  });
}
