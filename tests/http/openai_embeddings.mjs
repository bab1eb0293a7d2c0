// openai_embeddings.mjs: OpenAI's own Node client's embeddings.create against a running
// ordo-server, checked against the CPU reference's vectors. Run by test_openai_client.cpp:
// node openai_embeddings.mjs BASE_URL MODEL EXPECT_JSON, with ORDO_NODE_MODULES naming the
// node_modules folder that holds `openai`. EXPECT_JSON: {"texts": [...], "ids": [...],
// "text_vectors": [[...]...], "ids_vector": [...], "text_tokens": N, "n_embd": N,
// "tolerance": T}, computed by model::embed (model/reference.hpp). Prints "ok: CHECK" per
// check; exits 1 at the first failed one, naming it.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(process.env.ORDO_NODE_MODULES + '/');
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default;
const [baseURL, model, expectPath] = process.argv.slice(2);
const want = JSON.parse(readFileSync(expectPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAILED: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

// The largest componentwise difference, or Infinity when the lengths differ.
function maxDiff(a, b) {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

function close(got, expected, what) {
  const d = maxDiff(Array.from(got), expected);
  check(d <= want.tolerance, `${what}: within ${want.tolerance} of the reference`, d);
}

// The client's default: it asks for base64 and decodes the float32 bytes itself.
const batch = await client.embeddings.create({ model, input: want.texts });
check(batch.object === 'list' && batch.data.length === want.texts.length,
      'a list of strings: one embedding per input', batch.data.length);
batch.data.forEach((d, i) => {
  check(d.object === 'embedding' && d.index === i, `input ${i}: object and index`, d.index);
  check(d.embedding.length === want.n_embd, `input ${i}: n_embd floats`, d.embedding.length);
  close(d.embedding, want.text_vectors[i], `input ${i} (base64)`);
});
check(batch.usage.prompt_tokens === want.text_tokens &&
      batch.usage.total_tokens === want.text_tokens, 'usage.prompt_tokens counts every input',
      batch.usage);
check(batch.model === model, 'the answer names the model', batch.model);

// The raw base64 answer: a string of the little-endian float32 bytes.
const raw = await (await fetch(`${baseURL}/embeddings`, {
  method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model, input: want.texts[0], encoding_format: 'base64' }) })).json();
check(typeof raw.data[0].embedding === 'string', 'base64: the embedding is a string',
      typeof raw.data[0].embedding);
const bytes = Buffer.from(raw.data[0].embedding, 'base64');
check(bytes.length === 4 * want.n_embd, 'base64: n_embd float32s', bytes.length);
const decoded = [];
for (let i = 0; i < want.n_embd; i++) decoded.push(bytes.readFloatLE(4 * i));
close(decoded, want.text_vectors[0], 'base64 decoded by hand');

const one = await client.embeddings.create(
  { model, input: want.texts[0], encoding_format: 'float' });
check(one.data.length === 1, 'a string: one embedding');
close(one.data[0].embedding, want.text_vectors[0], 'encoding_format float');
const norm = Math.sqrt(one.data[0].embedding.reduce((s, v) => s + v * v, 0));
check(Math.abs(norm - 1) < 1e-5, 'the vector is L2-normalized', norm);

const ids = await client.embeddings.create({ model, input: want.ids, encoding_format: 'float' });
check(ids.data.length === 1, 'an array of token ids is one input', ids.data.length);
close(ids.data[0].embedding, want.ids_vector, 'token ids');
check(ids.usage.prompt_tokens === want.ids.length, 'token ids: usage', ids.usage);

const nested = await client.embeddings.create(
  { model, input: [want.ids, want.ids], encoding_format: 'float' });
check(nested.data.length === 2, 'an array of token arrays: one embedding each');
close(nested.data[1].embedding, want.ids_vector, 'token arrays, second');

const dims = await client.embeddings.create(
  { model, input: want.texts[0], dimensions: want.n_embd });
close(dims.data[0].embedding, want.text_vectors[0], 'dimensions = n_embd is a no-op');

for (const [what, body, param] of [
  ['an empty string', { model, input: '' }, 'input'],
  ['other dimensions', { model, input: 'x', dimensions: 3 }, 'dimensions'],
  ['encoding_format other', { model, input: 'x', encoding_format: 'int8' }, 'encoding_format'],
  ['a token id outside the vocabulary', { model, input: [1, 1 << 30] }, 'input']]) {
  try {
    await client.embeddings.create(body);
    check(false, `${what} was accepted`);
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param,
          `${what}: 400 naming ${param}`, [e.status, e.param, String(e)]);
  }
}
try {
  await client.embeddings.create({ model: 'other', input: 'x' });
  check(false, 'another model was accepted');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.param === 'model', 'another model: 404',
        [e.status, e.param]);
}
console.log('all checks passed');
