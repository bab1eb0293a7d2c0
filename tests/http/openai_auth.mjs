// openai_auth.mjs: OpenAI's own Node client (npm `openai`) against an ordo-server that requires
// an API key. Run by test_openai_client.cpp: node openai_auth.mjs BASE_URL MODEL KEY, with
// ORDO_NODE_MODULES naming the node_modules folder that holds `openai`. Checks: with `apiKey`
// the right key, models.list and a chat completion are served; with a wrong one the client
// raises its AuthenticationError (status 401, code invalid_api_key). Prints "ok: CHECK" per
// check; exits 1 at the first failed one, naming it.
import { createRequire } from 'node:module';

const require = createRequire(process.env.ORDO_NODE_MODULES + '/');
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default;
const [baseURL, model, apiKey] = process.argv.slice(2);

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAILED: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

// No retries: a refusal must show, not be retried away.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'the right key: models.list',
      models.data);
const chat = await client.chat.completions.create(
  { model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0 });
check(chat.usage.completion_tokens === 4, 'the right key: a chat completion', chat.usage);

const wrong = new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0, timeout: 30000 });
try {
  await wrong.models.list();
  check(false, 'a wrong key was accepted');
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError, 'a wrong key: AuthenticationError', String(e));
  check(e.status === 401, 'a wrong key: status 401', e.status);
  check(e.code === 'invalid_api_key', 'a wrong key: code invalid_api_key', e.code);
}
console.log('all checks passed');
