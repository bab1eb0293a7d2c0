// openai_tools.mjs: tool calls through OpenAI's own Node client (npm `openai`) against a running
// ordo-server whose chat template teaches Hermes' <tool_call> format (issue 31). Run by
// test_openai_client.cpp: node openai_tools.mjs BASE_URL MODEL. Prints "ok: CHECK" per check;
// exits 1 at the first failed one.
//
// The model has random weights: only the grammar makes its answers calls. Checks: tool_choice
// "required" always gives calls of the offered functions whose arguments parse and follow the
// schema (several seeds), finish_reason "tool_calls" and content null; a named function gives
// that function; parallel_tool_calls false gives one call; a streamed answer's tool_calls deltas
// put together are the non-streamed answer of the same seed; the answer's message, sent back
// with a tool result, renders (the next turn is answered); tool_choice "auto" and "none" answer.
import { createRequire } from 'node:module';

const require = createRequire(process.env.ORDO_NODE_MODULES + '/');
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default;
const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAILED: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: {
      city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
    required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: {
      a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }];
const base = { model, messages, tools, max_tokens: 400, temperature: 1 };

function follows(call) {
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    return typeof args.city === 'string' && [...args.city].length <= 8 && ['c', 'f'].includes(args.unit);
  }
  return call.function.name === 'add' && Number.isInteger(args.a) && Number.isInteger(args.b);
}

for (const seed of [1, 2, 3, 4, 5]) {
  const r = await client.chat.completions.create(
    { ...base, tool_choice: 'required', parallel_tool_calls: false, seed });
  const c = r.choices[0];
  check(c.finish_reason === 'tool_calls', `required, seed ${seed}: finish_reason tool_calls`, c);
  check(c.message.content === null, `required, seed ${seed}: content null`, c.message);
  check(c.message.tool_calls.length === 1, `required, seed ${seed}: one call`, c.message);
  const call = c.message.tool_calls[0];
  check(call.type === 'function' && typeof call.id === 'string' && call.id.length > 0,
        `required, seed ${seed}: id and type`, call);
  check(follows(call), `required, seed ${seed}: arguments parse and follow the schema`, call);
}

const named = await client.chat.completions.create(
  { ...base, tool_choice: { type: 'function', function: { name: 'add' } }, seed: 7,
    parallel_tool_calls: false });
check(named.choices[0].message.tool_calls.every((t) => t.function.name === 'add' && follows(t)),
      'a named function is the one called', named.choices[0].message);

// Streamed and whole answers of one seed.
const req = { ...base, tool_choice: 'required', seed: 11 };
const whole = (await client.chat.completions.create(req)).choices[0];
const stream = await client.chat.completions.create({ ...req, stream: true });
const calls = [];
let finish = null;
let content = '';
for await (const chunk of stream) {
  const ch = chunk.choices[0];
  if (!ch) continue;
  if (ch.finish_reason) finish = ch.finish_reason;
  content += ch.delta?.content ?? '';
  for (const d of ch.delta?.tool_calls ?? []) {
    if (!calls[d.index]) calls[d.index] = { name: d.function.name, arguments: '', id: d.id };
    calls[d.index].arguments += d.function?.arguments ?? '';
  }
}
check(finish === whole.finish_reason, 'stream: the same finish_reason', [finish, whole.finish_reason]);
check(content === '', 'stream: no content', content);
check(JSON.stringify(calls.map((c) => [c.name, c.arguments])) ===
      JSON.stringify(whole.message.tool_calls.map((c) => [c.function.name, c.function.arguments])),
      'stream: the deltas put together are the whole answer', [calls, whole.message.tool_calls]);
check(calls.every((c) => typeof c.id === 'string' && c.id.length > 0), 'stream: each call has an id');

// The next turn: the answer's message as the SDK returned it, then the tool's result.
const first = await client.chat.completions.create(
  { ...base, tool_choice: 'required', parallel_tool_calls: false, seed: 3 });
const next = await client.chat.completions.create({
  ...base, max_tokens: 8, seed: 3,
  messages: [...messages, first.choices[0].message,
             { role: 'tool', tool_call_id: first.choices[0].message.tool_calls[0].id,
               content: '{"temperature": 21}' }] });
check(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason),
      'history with a call and its result renders and is answered', next.choices[0]);

for (const tool_choice of ['auto', 'none']) {
  const r = await client.chat.completions.create({ ...base, max_tokens: 16, tool_choice, seed: 5 });
  const m = r.choices[0].message;
  check(typeof m.content === 'string' || (m.tool_calls ?? []).every(follows),
        `tool_choice ${tool_choice} answers`, m);
}
console.log('all checks passed');
