// tools.js - tool calling and reasoning end to end with the official openai SDK. The tiny model
// writes no markup by itself, so the servers here run in the test-only fixed-output mode
// (PXQ_TEST_OUTPUT: every request generates that text's tokens, then eos) with Qwen3's chat
// template (--chat-template) and vLLM's parsers (--reasoning-parser qwen3 --tool-call-parser
// hermes). Checked: message.tool_calls / reasoning_content / content and finish_reason
// "tool_calls", the same assembled from the streamed deltas (no partial tag ever sent as text),
// a history with tool calls and results sent back, malformed and unfinished calls coming back as
// content, and what stays refused (a tool_choice naming no tool, an unknown response_format type,
// tools without a tool parser). Forced calls (tool_choice "required" or a named function) are
// structured output: structured.js.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { OpenAI, BadRequestError } = require('openai');
const { ROOT, startServer, post, check, finish } = require('./common');

const REASONING = '\nI should call the tool.\n';
const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2.0}}\n</tool_call>';
const OUTPUT = `<think>${REASONING}</think>\n\n${CALL}`;
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'number' } }, required: ['city'] } } }];
const MSGS = [{ role: 'system', content: 'You are a weather bot.' }, { role: 'user', content: 'Weather in Paris?' }];

// Assemble a stream: reasoning, content, tool calls by index, finish_reason, and every text delta.
async function collect(stream) {
  const out = { reasoning: '', content: '', calls: [], finish: null, pieces: [] };
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    const d = ch.delta || {};
    if (d.reasoning_content) out.reasoning += d.reasoning_content, out.pieces.push(d.reasoning_content);
    if (d.content) out.content += d.content, out.pieces.push(d.content);
    for (const tc of d.tool_calls || []) {
      const c = out.calls[tc.index] || (out.calls[tc.index] = { id: '', type: '', name: '', arguments: '' });
      if (tc.id) c.id += tc.id;
      if (tc.type) c.type = tc.type;
      if (tc.function && tc.function.name) c.name += tc.function.name;
      if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
    }
    if (ch.finish_reason) out.finish = ch.finish_reason;
  }
  return out;
}

async function withServer(output, extraArgs, fn) {
  const srv = await startServer(['--served-model-name', 'tiny', '--max-model-len', '1024', ...extraArgs],
    output === null ? {} : { PXQ_TEST_OUTPUT: output });
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000 });
  try {
    await fn(client, srv);
  } catch (e) {
    check('no unexpected exception', false, e.stack);
  }
  const { code } = await srv.stop();
  check('SIGTERM: exit 0', code === 0, code);
}

(async () => {
  const tmpl = path.join(os.tmpdir(), `pxq-qwen3-${process.pid}.jinja`);
  fs.writeFileSync(tmpl, JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/data/qwen3-tokenizer/tokenizer_config.json'))).chat_template);
  const parsers = ['--chat-template', tmpl, '--reasoning-parser', 'qwen3', '--tool-call-parser', 'hermes'];

  await withServer(OUTPUT, parsers, async (client, srv) => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0 });
    const m = r.choices[0].message, tc = m.tool_calls && m.tool_calls[0];
    check('tool call: name, type and call_ id', tc && tc.type === 'function' && tc.function.name === 'get_weather' &&
      /^call_[0-9a-f]{24}$/.test(tc.id) && m.tool_calls.length === 1, JSON.stringify(m));
    check('tool call: arguments as Python json.dumps writes them', tc && tc.function.arguments === '{"city": "Paris", "days": 2.0}' &&
      JSON.parse(tc.function.arguments).city === 'Paris', tc && tc.function.arguments);
    check('reasoning_content and null content', m.reasoning_content === REASONING && m.content === null, JSON.stringify(m));
    check('finish_reason tool_calls', r.choices[0].finish_reason === 'tool_calls', r.choices[0].finish_reason);

    const s = await collect(await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0, stream: true }));
    check('streamed: the same reasoning, no content', s.reasoning === REASONING && s.content === '', JSON.stringify(s));
    check('streamed: one whole tool call with index, id, name and arguments', s.calls.length === 1 && s.calls[0].name === 'get_weather' &&
      s.calls[0].arguments === tc.function.arguments && /^call_/.test(s.calls[0].id) && s.calls[0].type === 'function', JSON.stringify(s.calls));
    check('streamed: finish_reason tool_calls', s.finish === 'tool_calls', s.finish);
    check('streamed: no text delta carries a tag or part of one', s.pieces.every((p) => !/<\/?(t(h(i(n(k)?)?)?)?|tool_call)?$|<\/?think>|<tool_call>/.test(p)),
      JSON.stringify(s.pieces));

    // without tools (or with tool_choice none) the call is not parsed: content, finish_reason stop
    const plain = await client.chat.completions.create({ model: 'tiny', messages: MSGS, temperature: 0 });
    check('no tools: the call stays content, reasoning still split', plain.choices[0].message.content === `\n\n${CALL}` &&
      plain.choices[0].message.reasoning_content === REASONING && !plain.choices[0].message.tool_calls &&
      plain.choices[0].finish_reason === 'stop', JSON.stringify(plain.choices[0]));
    const none = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, tool_choice: 'none', temperature: 0 });
    check('tool_choice none: the tools are shown (longer prompt), the call stays content', none.choices[0].message.content === `\n\n${CALL}` &&
      none.usage.prompt_tokens > plain.usage.prompt_tokens, JSON.stringify(none));
    const ns = await collect(await client.chat.completions.create({ model: 'tiny', messages: MSGS, temperature: 0, stream: true }));
    check('no tools, streamed: the same content', ns.content === `\n\n${CALL}` && ns.reasoning === REASONING && ns.finish === 'stop', JSON.stringify(ns));

    // the history goes back with the call and its result
    const history = [...MSGS, { role: 'assistant', content: null, tool_calls: m.tool_calls, reasoning_content: m.reasoning_content },
      { role: 'tool', tool_call_id: tc.id, content: '{"temp": 21}' }];
    const again = await client.chat.completions.create({ model: 'tiny', messages: history, tools: TOOLS, temperature: 0 });
    check('a history with tool_calls and a tool result: 200, longer prompt', again.choices[0].finish_reason === 'tool_calls' &&
      again.usage.prompt_tokens > r.usage.prompt_tokens + 20, JSON.stringify(again.usage));
    const withArgs = (args) => history.map((x) => (x.tool_calls ? { ...x, tool_calls: [{ ...x.tool_calls[0], function: { name: 'get_weather',
      arguments: args } }] } : x));
    const asObj = await post(srv.port, '/v1/chat/completions', { model: 'tiny', messages: withArgs({ city: 'Paris', days: 2 }), tools: TOOLS, max_tokens: 1 });
    const asStr = await post(srv.port, '/v1/chat/completions', { model: 'tiny', messages: withArgs('{"city":"Paris","days":2}'), tools: TOOLS, max_tokens: 1 });
    check('arguments as an object: the same prompt as the JSON string', asObj.status === 200 && asStr.status === 200 &&
      JSON.parse(asObj.body).usage.prompt_tokens === JSON.parse(asStr.body).usage.prompt_tokens &&
      JSON.parse(asStr.body).usage.prompt_tokens === again.usage.prompt_tokens - 2, asObj.body + asStr.body);

    const refused = async (name, body, param, re) => {
      let err = null;
      try { await client.chat.completions.create({ model: 'tiny', messages: MSGS, max_tokens: 4, ...body }); } catch (e) { err = e; }
      check(`${name}: BadRequestError naming ${param}`, err instanceof BadRequestError && err.param === param && re.test(err.message), String(err));
    };
    await refused('a tool_choice naming no tool', { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } } }, 'tool_choice',
      /'get_time', which is not in 'tools'/);
    await refused('tool_choice of another kind', { tools: TOOLS, tool_choice: 'always' }, 'tool_choice', /must be "none", "auto", "required"/);
    await refused('an unknown response_format type', { response_format: { type: 'yaml' } }, 'response_format', /'yaml' is not supported/);
    await refused('arguments that are not JSON', { messages: [...MSGS, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function',
      function: { name: 'f', arguments: '{"city": ' } }] }, { role: 'tool', tool_call_id: 'c', content: 'x' }] }, 'messages', /not valid JSON/);
    await refused('a tool without a name', { tools: [{ type: 'function', function: { parameters: {} } }] }, 'tools', /name/);
  });

  // malformed and unfinished calls come back as content, with the usual finish_reason
  const bad = '<think>r</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par';
  await withServer(bad, parsers, async (client) => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0 });
    const m = r.choices[0].message;
    check('unfinished call: content, reasoning split, finish_reason stop', m.content === bad.slice('<think>r</think>'.length) &&
      m.reasoning_content === 'r' && !m.tool_calls && r.choices[0].finish_reason === 'stop', JSON.stringify(r.choices[0]));
    const s = await collect(await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0, stream: true }));
    check('unfinished call, streamed: the same content and finish_reason', s.content === m.content && s.reasoning === 'r' &&
      s.calls.length === 0 && s.finish === 'stop', JSON.stringify(s));
    const cut = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0, max_tokens: 12 });
    check('cut by max_tokens inside the call: content so far, finish_reason length', cut.choices[0].finish_reason === 'length' &&
      !cut.choices[0].message.tool_calls, JSON.stringify(cut.choices[0]));
  });
  const malformed = 'Sure.\n<tool_call>\n{"name": "get_weather"}\n</tool_call>';
  await withServer(malformed, parsers, async (client) => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0 });
    check('call without arguments: all content, finish_reason stop', r.choices[0].message.content === malformed &&
      !r.choices[0].message.tool_calls && r.choices[0].finish_reason === 'stop', JSON.stringify(r.choices[0]));
    const s = await collect(await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, temperature: 0, stream: true }));
    check('call without arguments, streamed: the same', s.content === malformed && s.calls.length === 0 && s.finish === 'stop', JSON.stringify(s));
  });

  // Qwen3's template without --tool-call-parser: "auto" is refused (vLLM's rule), "none" renders the tools
  await withServer(null, ['--chat-template', tmpl], async (client) => {
    let err = null;
    try { await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, max_tokens: 2 }); } catch (e) { err = e; }
    check('tools without --tool-call-parser: 400 naming tool_choice', err instanceof BadRequestError && err.param === 'tool_choice' &&
      /--tool-call-parser/.test(err.message), String(err));
    const r = await client.chat.completions.create({ model: 'tiny', messages: MSGS, tools: TOOLS, tool_choice: 'none', max_tokens: 2 });
    check('tool_choice none without a parser: 200, no reasoning_content field', r.choices[0].message.reasoning_content === undefined &&
      typeof r.choices[0].message.content === 'string', JSON.stringify(r.choices[0]));
  });
  fs.unlinkSync(tmpl);
  finish();
})();
