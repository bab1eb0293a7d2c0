// openai_client.mjs: OpenAI's own Node client (npm `openai`) against a running ordo-server.
// Run by test_openai_client.cpp: node openai_client.mjs BASE_URL MODEL, with ORDO_NODE_MODULES
// naming the node_modules folder that holds `openai`. Prints "ok: CHECK" per check; exits 1 at
// the first failed one, naming it.
import { createRequire } from 'node:module';

const require = createRequire(process.env.ORDO_NODE_MODULES + '/');
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default;
const [baseURL, model] = process.argv.slice(2);
// No retries: a 429 or 5xx must show, not be retried away.
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
const messages = [{ role: 'user', content: 'Tell me a story.' }];

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAILED: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

async function refused(what, body, status, param, cls) {
  try {
    await client.chat.completions.create(body);
    check(false, what + ' was accepted');
  } catch (e) {
    check(e instanceof cls, `${what}: ${cls.name}`, String(e));
    check(e.status === status, `${what}: status ${status}`, e.status);
    check(e.param === param, `${what}: param ${param}`, e.param);
    check(typeof e.message === 'string' && e.message.length > 0, `${what}: a message`);
  }
}

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'models.list names the model',
      models.data);

const chat = await client.chat.completions.create(
  { model, messages, max_tokens: 8, temperature: 0 });
const text = chat.choices[0].message.content;
check(typeof text === 'string', 'chat: content is a string', chat);
check(chat.choices[0].finish_reason === 'length', 'chat: finish_reason length', chat.choices[0]);
check(chat.usage.completion_tokens === 8, 'chat: usage.completion_tokens', chat.usage);
check(chat.usage.total_tokens === chat.usage.prompt_tokens + 8, 'chat: usage.total_tokens');

const stream = await client.chat.completions.create(
  { model, messages, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
let streamed = '', finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(streamed === text, 'chat stream adds up to the non-streamed content', [streamed, text]);
check(finish === 'length', 'chat stream: finish_reason');
check(usage && usage.completion_tokens === 8, 'chat stream: usage chunk', usage);

const comp = await client.completions.create(
  { model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
const ctext = comp.choices[0].text;
let cstreamed = '';
for await (const chunk of await client.completions.create(
  { model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stream: true })) {
  cstreamed += chunk.choices[0]?.text ?? '';
}
check(cstreamed === ctext, 'completions stream adds up to the non-streamed text');

// A stop string: the first ASCII letter or digit after the start of the greedy text.
const at = [...ctext].findIndex((ch, i) => i > 0 && /[A-Za-z0-9]/.test(ch));
if (at > 0) {
  const stop = [...ctext][at];
  const stopped = await client.completions.create(
    { model, prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: [stop] });
  check(stopped.choices[0].text === ctext.slice(0, ctext.indexOf(stop)),
        'stop: the text ends before the stop string', [stopped.choices[0].text, stop]);
  check(stopped.choices[0].finish_reason === 'stop', 'stop: finish_reason stop');
} else {
  console.log('note: no ASCII character in the greedy text to stop at; stop check not run');
}

const seeded = { model, messages, max_tokens: 12, temperature: 1.0, seed: 1234 };
const a = await client.chat.completions.create(seeded);
const b = await client.chat.completions.create(seeded);
check(a.choices[0].message.content === b.choices[0].message.content, 'same seed, same text');

const lp = await client.chat.completions.create(
  { model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
const content = lp.choices[0].logprobs?.content ?? [];
check(content.length === 5, 'logprobs: one entry per token', lp.choices[0].logprobs);
check(content.every((t) => typeof t.logprob === 'number' && t.logprob <= 0 &&
                            t.top_logprobs.length === 2), 'logprobs: values and top_logprobs');

await refused('a model not served', { model: 'gpt-4o', messages }, 404, 'model',
              OpenAI.NotFoundError);
await refused('n = 2', { model, messages, n: 2 }, 400, 'n', OpenAI.BadRequestError);
await refused('response_format', { model, messages, response_format: { type: 'json_schema',
              json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } } },
              400, 'response_format', OpenAI.BadRequestError);
// This model's template (ChatML without tools) shows no tool-call format: auto answers text,
// required cannot be kept (openai_tools.mjs drives tool calls on a template that has one).
await refused('tool_choice required without a call format', { model, messages, tools: [{ type:
              'function', function: { name: 'f', parameters: {} } }], tool_choice: 'required' },
              400, 'tool_choice', OpenAI.BadRequestError);
await refused('a tool with a bad name', { model, messages, tools: [{ type: 'function',
              function: { name: 'f g' } }] }, 400, 'tools', OpenAI.BadRequestError);
// Regenerate samples afresh: without a seed the server draws one and reports it (ordo's `seed`
// extension); sending that seed back reproduces the answer (issue 27).
const unseeded = { model, messages, max_tokens: 24, temperature: 1 };
const first = await client.chat.completions.create(unseeded);
const second = await client.chat.completions.create(unseeded);
check(first.choices[0].message.content !== second.choices[0].message.content,
      'two unseeded answers at temperature 1 differ',
      [first.choices[0].message.content, second.choices[0].message.content]);
check(typeof first.seed === 'number' && first.seed !== second.seed, 'each answer reports its seed',
      [first.seed, second.seed]);
// The seed is a 64-bit integer; JSON numbers past 2^53 lose digits in JavaScript, so the
// reproduction sends the seed through the raw body.
const firstRaw = await (await fetch(`${baseURL}/chat/completions`, {
  method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ ...unseeded, seed: 12345 }) })).json();
const again = await client.chat.completions.create({ ...unseeded, seed: firstRaw.seed });
check(firstRaw.seed === 12345 && again.choices[0].message.content ===
      firstRaw.choices[0].message.content, 'a reported seed reproduces its answer',
      [firstRaw.seed, again.choices[0].message.content, firstRaw.choices[0].message.content]);

// Structured output as the SDK sends it: json_schema (strict) and JSON mode. A whole answer
// parses and follows the schema; one cut by max_tokens still begins an object.
const schema = { type: 'object', properties: { answer: { type: 'string', maxLength: 4 } },
                 required: ['answer'], additionalProperties: false };
for (const [what, response_format] of [
  ['json_schema', { type: 'json_schema', json_schema: { name: 'reply', strict: true, schema } }],
  ['json_object', { type: 'json_object' }]]) {
  const r = await client.chat.completions.create(
    { model, messages, max_tokens: 200, seed: 3, response_format });
  const text = r.choices[0].message.content;
  if (r.choices[0].finish_reason === 'stop') {
    let doc = null;
    try { doc = JSON.parse(text); } catch (e) { check(false, `${what}: the answer parses`, text); }
    check(doc !== null && typeof doc === 'object' && !Array.isArray(doc),
          `${what}: the answer is one JSON object`, text);
    if (what === 'json_schema') {
      check(Object.keys(doc).length === 1 && typeof doc.answer === 'string' &&
            doc.answer.length <= 4, 'json_schema: the answer follows the schema', text);
    }
  } else {
    check(/^\s*\{/.test(text), `${what}: a cut answer still begins an object`, text);
  }
}

// What client libraries send by default is accepted: each of these asks for exactly what ordo
// does anyway. Greedy, so the two tokens are the same every run (a sampled first token of this
// random-weight model can be its end of text, which would end the answer with stop).
for (const [what, extra] of [
  ['tools: []', { tools: [] }], ['tools: null', { tools: null }],
  ['parallel_tool_calls: null', { parallel_tool_calls: null }],
  ['tool_choice: none', { tool_choice: 'none' }],
  ['response_format: text', { response_format: { type: 'text' } }],
  ['seed: -1', { seed: -1 }]]) {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 2, temperature: 0,
                                                  ...extra });
  check(r.choices[0].finish_reason === 'length', `no-op accepted: ${what}`, r);
}
for (const [what, extra] of [
  ['echo: false', { echo: false }], ['suffix: null', { suffix: null }],
  ['best_of: 1', { best_of: 1 }]]) {
  const r = await client.completions.create({ model, prompt: 'Once', max_tokens: 2, temperature: 0,
                                             ...extra });
  check(r.choices[0].finish_reason === 'length', `no-op accepted: ${what}`, r);
}
console.log('all checks passed');
