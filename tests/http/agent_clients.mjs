// agent_clients.mjs: the agent and structured-output paths of two popular client libraries
// against a running ordo-server whose chat template teaches Hermes' <tool_call> format (issue
// 31): LangChain (`@langchain/openai`: bindTools with a named tool, streamed too, and
// withStructuredOutput by function calling and by JSON schema) and the Vercel AI SDK (`ai` with
// `@ai-sdk/openai`: generateObject, streamObject, generateText with toolChoice required and
// streamText with a named tool). Run by test_openai_client.cpp: node agent_clients.mjs BASE_URL
// MODEL, with ORDO_NODE_MODULES naming the node_modules folder. The model has random weights:
// only the grammar makes its answers follow the schemas. Prints "ok: CHECK" per check; exits 1
// at the first failed one.
import { createRequire } from 'node:module';

const require = createRequire(process.env.ORDO_NODE_MODULES + '/');
const { ChatOpenAI } = require('@langchain/openai');
const { createOpenAI } = require('@ai-sdk/openai');
const { generateObject, streamObject, generateText, streamText, tool } = require('ai');
const { z } = require('zod');
const [baseURL, model] = process.argv.slice(2);

function check(cond, what, detail) {
  if (!cond) {
    console.log(`FAILED: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const weather = z.object({ city: z.string().max(8), unit: z.enum(['c', 'f']) });
const follows = (args) => weather.safeParse(args).success;
const reply = z.object({ answer: z.string().max(6) });

// LangChain.
const llm = new ChatOpenAI({ model, apiKey: 'unused', configuration: { baseURL },
                             maxTokens: 300, temperature: 1, maxRetries: 0 });
const lcTool = { name: 'get_weather', description: 'The weather in a city', schema: weather };
const bound = llm.bindTools([lcTool], { tool_choice: 'get_weather', parallel_tool_calls: false });
const msg = await bound.invoke('Weather in Oslo?');
check(msg.tool_calls.length === 1 && msg.tool_calls[0].name === 'get_weather' &&
      follows(msg.tool_calls[0].args), 'LangChain bindTools: one call that follows the schema',
      msg.tool_calls);
let agg;
for await (const chunk of await bound.stream('Weather in Oslo?')) agg = agg ? agg.concat(chunk) : chunk;
check(agg.tool_calls.length === 1 && follows(agg.tool_calls[0].args),
      'LangChain bindTools streamed: the chunks make one valid call', agg.tool_calls);
for (const method of ['functionCalling', 'jsonSchema']) {
  const r = await llm.withStructuredOutput(reply, { method, name: 'reply' }).invoke('Reply.');
  check(reply.safeParse(r).success, `LangChain withStructuredOutput ${method}`, r);
}

// Vercel AI SDK.
const openai = createOpenAI({ baseURL, apiKey: 'unused' });
const m = openai.chat(model);
const common = { model: m, maxRetries: 0, temperature: 1, maxOutputTokens: 300 };
const obj = await generateObject({ ...common, schema: reply, prompt: 'Reply.' });
check(reply.safeParse(obj.object).success, 'AI SDK generateObject', obj.object);
const so = streamObject({ ...common, schema: reply, prompt: 'Reply.' });
for await (const _ of so.partialObjectStream) { /* partial objects as they stream */ }
const streamed = await so.object;
check(reply.safeParse(streamed).success, 'AI SDK streamObject', streamed);
const tools = { get_weather: tool({ description: 'The weather in a city', inputSchema: weather }) };
const noParallel = { providerOptions: { openai: { parallelToolCalls: false } } };
const gt = await generateText({ ...common, ...noParallel, tools, toolChoice: 'required',
                                prompt: 'Weather in Oslo?' });
check(gt.finishReason === 'tool-calls' && gt.toolCalls.length === 1 &&
      follows(gt.toolCalls[0].input), 'AI SDK generateText toolChoice required', gt.toolCalls);
const st = streamText({ ...common, ...noParallel, tools,
                        toolChoice: { type: 'tool', toolName: 'get_weather' },
                        prompt: 'Weather in Oslo?' });
const calls = await st.toolCalls;
check(calls.length === 1 && calls[0].toolName === 'get_weather' && follows(calls[0].input),
      'AI SDK streamText with a named tool', calls);
console.log('all checks passed');
