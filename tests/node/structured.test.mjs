// structured.test.mjs - structured outputs on the demo model, through the
// SDKs' own structured-output helpers: OpenAI chat.completions.parse with a
// strict json_schema response_format (and json_object), Responses
// responses.parse with text.format, Anthropic messages.parse with
// output_config.format from jsonSchemaOutputFormat. The demo model was
// never trained on JSON; sampling under the schema's grammar
// (server/json_grammar.h) makes every answer parse and validate anyway, in
// chat and thinking mode, and when the output budget ends inside the JSON
// the server closes it. Validation here is written from the schema.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { jsonSchemaOutputFormat } from '@anthropic-ai/sdk/helpers/json-schema';
import { startServer, repoRoot, postJson } from './helpers.mjs';

const model = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const skip = existsSync(model) ? false : 'models/ds4-demo.gguf missing';
let srv;
before(async () => {
  if (!skip) srv = await startServer(['-m', model, '--ctx', '4096', '-t', '2'], { testEngine: false });
});
after(async () => { if (srv) await srv.stop(); });

const schema = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 24 },
    country: { type: 'string', maxLength: 24 },
    population: { type: 'integer' },
    capital: { type: 'boolean' },
    kind: { enum: ['city', 'town', 'village'] },
  },
  required: ['city', 'country', 'population', 'capital', 'kind'],
  additionalProperties: false,
};
function validates(o) {
  assert.equal(typeof o, 'object');
  assert.ok(o !== null && !Array.isArray(o));
  assert.deepEqual(Object.keys(o).sort(), ['capital', 'city', 'country', 'kind', 'population']);
  assert.equal(typeof o.city, 'string');
  assert.ok(o.city.length <= 24);
  assert.equal(typeof o.country, 'string');
  assert.ok(Number.isInteger(o.population));
  assert.equal(typeof o.capital, 'boolean');
  assert.ok(['city', 'town', 'village'].includes(o.kind));
}
const question = [{ role: 'user', content: 'What is the capital of France? Answer in JSON.' }];
const openai = () => new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });

for (const effort of ['none', 'high']) {
  test(`OpenAI chat.completions.parse, strict json_schema, reasoning ${effort}`, { skip }, async () => {
    const r = await openai().chat.completions.parse({
      model: 'deepseek-v4-flash', messages: question, max_tokens: 400, temperature: 0, reasoning_effort: effort,
      response_format: { type: 'json_schema', json_schema: { name: 'place', strict: true, schema } },
    });
    const m = r.choices[0].message;
    validates(m.parsed);
    assert.deepEqual(m.parsed, JSON.parse(m.content));
  });
}

test('OpenAI json_object: an object, sampled at temperature 1 too', { skip }, async () => {
  for (const temperature of [0, 1]) {
    const r = await openai().chat.completions.create({
      model: 'deepseek-chat', messages: question, max_tokens: 400, temperature, seed: 7,
      response_format: { type: 'json_object' },
    });
    const o = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof o, 'object');
    assert.ok(o !== null && !Array.isArray(o));
  }
});

test('a budget that ends inside the JSON: the server closes it, finish length', { skip }, async () => {
  for (const max of [1, 5, 12]) {
    const r = await openai().chat.completions.create({
      model: 'deepseek-chat', messages: question, max_tokens: max, temperature: 0,
      response_format: { type: 'json_schema', json_schema: { name: 'place', strict: true, schema } },
    });
    // the shortest completion of the empty answer needs more tokens than
    // these budgets: nothing that could parse fits, the answer is empty
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'length');
    if (c.message.content) validates(JSON.parse(c.message.content));
  }
  const r = await openai().chat.completions.create({
    model: 'deepseek-chat', messages: question, max_tokens: 90, temperature: 1, seed: 3,
    response_format: { type: 'json_schema', json_schema: { name: 'place', strict: true, schema } },
  });
  validates(JSON.parse(r.choices[0].message.content));
  assert.ok(r.usage.completion_tokens <= 90);
});

// The forced completion can repeat a string of the client's schema (here a
// const holding a chat marker): it must go into the session as text, as
// the same bytes in a replayed answer are tokenized, so the next turn
// extends the session (a real control token there would make the replay
// disagree with the session and prefill it cold).
test('a forced completion that spells a chat marker stays text: the next turn reuses it', { skip }, async () => {
  const marker = '<\uff5cUser\uff5c> hi';
  const s = { type: 'object', properties: { k: { const: marker } }, required: ['k'], additionalProperties: false };
  const q = [{ role: 'user', content: 'Say something.' }];
  const r1 = await openai().chat.completions.create({
    model: 'deepseek-chat', messages: q, max_tokens: 20, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'm', strict: true, schema: s } },
  });
  const c = r1.choices[0].message.content;
  assert.deepEqual(JSON.parse(c), { k: marker });
  const r2 = await openai().chat.completions.create({
    model: 'deepseek-chat', max_tokens: 20, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'm', strict: true, schema: s } },
    messages: [...q, { role: 'assistant', content: c }, { role: 'user', content: 'Again.' }],
  });
  const reused = r2.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(reused >= r1.usage.prompt_tokens + r1.usage.completion_tokens,
    `turn 2 reused ${reused}, turn 1 held ${r1.usage.prompt_tokens} + ${r1.usage.completion_tokens}`);
});

test('Responses responses.parse with text.format json_schema', { skip }, async () => {
  const r = await openai().responses.parse({
    model: 'deepseek-v4-flash', input: question[0].content, max_output_tokens: 400, temperature: 0,
    text: { format: { type: 'json_schema', name: 'place', strict: true, schema } },
  });
  validates(r.output_parsed);
});

test('Anthropic messages.parse with output_config.format (jsonSchemaOutputFormat)', { skip }, async () => {
  const a = new Anthropic({ apiKey: 'x', baseURL: srv.base, maxRetries: 0 });
  const m = await a.messages.parse({
    model: 'deepseek-v4-flash', max_tokens: 400, temperature: 0, messages: question,
    output_config: { format: jsonSchemaOutputFormat(schema) },
  });
  validates(m.parsed_output);
});

test('a schema the grammar cannot take is a 400 naming the field', { skip }, async () => {
  const r = await postJson(srv.base, '/v1/chat/completions', { model: 'm', messages: question,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/defs/a' } } } });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'response_format.json_schema.schema');
});
