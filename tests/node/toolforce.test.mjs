// toolforce.test.mjs - structured output through a forced tool call, on the
// demo model: Anthropic tool_choice {type:"tool"} / {type:"any"} and OpenAI
// named tool_choice with strict tools. The server samples the call's DSML
// parameters under the tool's schema (server/dsml_grammar.h), so the
// input the SDK hands back always validates, with thinking on or off, at
// temperature 0 and 1, streamed or not. The validator below is written
// from the schema; the control test shows it catching what the demo model
// writes when the call is forced but its parameters are not constrained
// (an OpenAI tool without strict).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, repoRoot, postJson } from './helpers.mjs';

const model = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const skip = existsSync(model) ? false : 'models/ds4-demo.gguf missing';
let srv;
before(async () => {
  if (!skip) srv = await startServer(['-m', model, '--ctx', '4096', '-t', '2'], { testEngine: false });
});
after(async () => { if (srv) await srv.stop(); });

const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 20 },
    days: { type: 'integer' },
    unit: { enum: ['celsius', 'fahrenheit'] },
    threshold: { type: 'number' },
    alerts: { type: 'boolean' },
    hours: { type: 'array', items: { type: 'integer' }, maxItems: 3 },
  },
  required: ['city', 'days', 'unit', 'threshold', 'alerts'],
  additionalProperties: false,
};
const clock = {
  type: 'object',
  properties: { zone: { enum: ['UTC', 'CET', 'JST'] }, seconds: { type: 'boolean' } },
  required: ['zone', 'seconds'],
  additionalProperties: false,
};

// What the schema says, checked on the parsed input; returns the problems.
function problems(o, schema) {
  const out = [];
  if (typeof o !== 'object' || o === null || Array.isArray(o)) return ['not an object'];
  for (const k of schema.required) if (!(k in o)) out.push(`missing ${k}`);
  for (const [k, v] of Object.entries(o)) {
    const p = schema.properties[k];
    if (!p) { out.push(`undeclared ${k}`); continue; }
    if (p.enum && !p.enum.includes(v)) out.push(`${k} not in enum`);
    if (p.type === 'string' && (typeof v !== 'string' || v.length > p.maxLength)) out.push(`${k} not a short string`);
    if (p.type === 'integer' && !Number.isInteger(v)) out.push(`${k} not an integer`);
    if (p.type === 'number' && typeof v !== 'number') out.push(`${k} not a number`);
    if (p.type === 'boolean' && typeof v !== 'boolean') out.push(`${k} not a boolean`);
    if (p.type === 'array' && (!Array.isArray(v) || v.length > p.maxItems || !v.every(Number.isInteger)))
      out.push(`${k} not a short integer array`);
  }
  return out;
}

const prompts = ['What is the weather in Paris?', 'Hello', 'Tell me a story about a dragon.'];
const anthropic = () => new Anthropic({ apiKey: 'x', baseURL: srv.base, maxRetries: 0 });
const openai = () => new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });
const atools = [
  { name: 'get_weather', description: 'Get the weather forecast', input_schema: weather },
  { name: 'get_time', description: 'Get the time', input_schema: clock },
];

for (const thinking of [false, true]) {
  test(`Anthropic tool_choice tool: the input validates, thinking ${thinking ? 'on' : 'off'}`, { skip }, async () => {
    for (const [content, temperature] of [[prompts[0], 0], [prompts[1], 1], [prompts[2], 1]]) {
      {
        const m = await anthropic().messages.create({
          model: 'deepseek-v4-flash', max_tokens: 600, temperature, tools: atools,
          tool_choice: { type: 'tool', name: 'get_weather' },
          thinking: thinking ? { type: 'enabled', budget_tokens: 200 } : { type: 'disabled' },
          messages: [{ role: 'user', content }],
        });
        assert.equal(m.stop_reason, 'tool_use', `${content} t=${temperature}`);
        const uses = m.content.filter((b) => b.type === 'tool_use');
        assert.equal(uses.length, 1);
        assert.equal(uses[0].name, 'get_weather');
        assert.deepEqual(problems(uses[0].input, weather), [], `${content} t=${temperature}: ${JSON.stringify(uses[0].input)}`);
        if (thinking) assert.ok(m.content.some((b) => b.type === 'thinking'));
      }
    }
  });
}

test('Anthropic tool_choice any: whichever tool is called, its input validates (streamed)', { skip }, async () => {
  for (const content of ['What time is it in Tokyo?', prompts[2]]) {
    const stream = anthropic().messages.stream({
      model: 'deepseek-v4-flash', max_tokens: 600, temperature: 1, tools: atools, tool_choice: { type: 'any' },
      thinking: { type: 'enabled', budget_tokens: 200 }, messages: [{ role: 'user', content }],
    });
    const m = await stream.finalMessage();
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1);
    for (const u of uses) {
      const schema = u.name === 'get_weather' ? weather : u.name === 'get_time' ? clock : null;
      assert.ok(schema, `called ${u.name}`);
      assert.deepEqual(problems(u.input, schema), [], `${content}: ${u.name} ${JSON.stringify(u.input)}`);
    }
  }
});

const otools = (strict) => [{
  type: 'function', function: { name: 'get_weather', description: 'Get the weather forecast', strict, parameters: weather },
}];

test('OpenAI strict tool, named tool_choice: chat.completions.parse gives parsed_arguments that validate', { skip }, async () => {
  for (const reasoning_effort of ['none', 'high']) {
    const r = await openai().chat.completions.parse({
      model: 'deepseek-v4-flash', max_tokens: 600, temperature: 0, reasoning_effort, tools: otools(true),
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      messages: [{ role: 'user', content: prompts[0] }],
    });
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(problems(call.function.parsed_arguments, weather), [], call.function.arguments);
  }
});

test('control: without strict the forced call is not constrained, and the demo model breaks the schema', { skip }, async () => {
  const r = await openai().chat.completions.create({
    model: 'deepseek-v4-flash', max_tokens: 600, temperature: 0, tools: otools(false),
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    messages: [{ role: 'user', content: prompts[0] }],
  });
  const call = r.choices[0].message.tool_calls[0];
  assert.notDeepEqual(problems(JSON.parse(call.function.arguments), weather), [], call.function.arguments);
});

test('a forced strict tool whose schema the grammar cannot take is a 400 naming the field', { skip }, async () => {
  const tools = [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'array' } } }];
  const messages = [{ role: 'user', content: 'hi' }];
  const r = await postJson(srv.base, '/v1/chat/completions', {
    model: 'm', messages, tools, tool_choice: { type: 'function', function: { name: 'f' } },
  });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'tools[0].parameters');
  // not forced: the model may call it or not, the request is served
  const ok = await postJson(srv.base, '/v1/chat/completions', { model: 'm', messages, tools, max_tokens: 3 });
  assert.equal(ok.status, 200);
});

test('a budget that ends inside the forced call: the server completes it, the input still validates', { skip }, async () => {
  let cut = 0;
  for (const thinking of [false, true]) {
    for (const max_tokens of [110, 140, 170]) {
      const m = await anthropic().messages.create({
        model: 'deepseek-v4-flash', max_tokens, temperature: 0, tools: atools,
        tool_choice: { type: 'tool', name: 'get_weather' },
        thinking: thinking ? { type: 'enabled', budget_tokens: 200 } : { type: 'disabled' },
        messages: [{ role: 'user', content: prompts[2] }],
      });
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.equal(uses.length, 1, `max_tokens ${max_tokens}, thinking ${thinking}: ${JSON.stringify(m.content)}`);
      assert.deepEqual(problems(uses[0].input, weather), [], JSON.stringify(uses[0].input));
      assert.ok(m.usage.output_tokens <= max_tokens);
      assert.ok(['max_tokens', 'tool_use'].includes(m.stop_reason), m.stop_reason);
      if (m.stop_reason === 'max_tokens') cut++;
    }
  }
  assert.ok(cut >= 2, `only ${cut} answers were cut by the budget`);
});
