// The target of the official MCP conformance suite's server scenarios in `cargo xtask e2e`
// (`@modelcontextprotocol/conformance`, pinned in xtask/src/e2e.rs): an MCP server written
// here, on the official TypeScript SDK (`@modelcontextprotocol/sdk`, pinned), that offers
// what each scenario asks for (tools, resources, prompts, completion, logging, progress,
// sampling, elicitation). The suite's scenarios are its specification; its code is not
// copied from the suite's reference server.
//
//   node conformance-server.mjs --modules DIR --http PORT   streamable HTTP at /mcp, for the
//                                                           suite run against it directly
//   node conformance-server.mjs --modules DIR --stdio       stdio, as a downstream server of
//                                                           `gate serve`
//
// DIR is the node_modules directory the SDK is installed in (target/e2e/conformance/
// node_modules): the script lives in the source tree, its packages under target/.
//
// No tool is annotated: like the suite's own server, every tool is what MCP calls a write
// unless someone says otherwise (through the gate, the person's `reads = [...]` does).

import { createRequire } from 'node:module';
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { deflateSync, crc32 } from 'node:zlib';
import path from 'node:path';

function option(name) {
  const at = process.argv.indexOf(name);
  return at >= 0 ? process.argv[at + 1] : undefined;
}

const modules = option('--modules');
if (!modules) {
  console.error('conformance-server: --modules DIR (the node_modules holding @modelcontextprotocol/sdk) is required');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modules), 'resolve.js'));
const { Server } = require('@modelcontextprotocol/sdk/server/index.js');
const { StdioServerTransport } = require('@modelcontextprotocol/sdk/server/stdio.js');
const { StreamableHTTPServerTransport } = require('@modelcontextprotocol/sdk/server/streamableHttp.js');
const types = require('@modelcontextprotocol/sdk/types.js');

// ── Media, made here: a 2x2 PNG and a tenth of a second of silence as a WAV. ──

function png() {
  const chunk = (kind, data) => {
    const body = Buffer.concat([Buffer.from(kind, 'latin1'), data]);
    const length = Buffer.alloc(4);
    length.writeUInt32BE(data.length);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(body));
    return Buffer.concat([length, body, crc]);
  };
  const header = Buffer.alloc(13);
  header.writeUInt32BE(2, 0); // width
  header.writeUInt32BE(2, 4); // height
  header[8] = 8; // bits per sample
  header[9] = 2; // RGB
  // Two rows, each a filter byte (0) and two pixels: blue, yellow / yellow, blue.
  const rows = Buffer.from([0, 0, 0, 255, 255, 255, 0, 0, 255, 255, 0, 0, 0, 255]);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', header),
    chunk('IDAT', deflateSync(rows)),
    chunk('IEND', Buffer.alloc(0)),
  ]).toString('base64');
}

function wav() {
  const rate = 8000;
  const samples = Buffer.alloc(rate / 10, 128); // 8-bit mono silence
  const head = Buffer.alloc(44);
  head.write('RIFF', 0, 'latin1');
  head.writeUInt32LE(36 + samples.length, 4);
  head.write('WAVEfmt ', 8, 'latin1');
  head.writeUInt32LE(16, 16); // fmt chunk size
  head.writeUInt16LE(1, 20); // PCM
  head.writeUInt16LE(1, 22); // mono
  head.writeUInt32LE(rate, 24);
  head.writeUInt32LE(rate, 28); // bytes per second
  head.writeUInt16LE(1, 32); // block align
  head.writeUInt16LE(8, 34); // bits per sample
  head.write('data', 36, 'latin1');
  head.writeUInt32LE(samples.length, 40);
  return Buffer.concat([head, samples]).toString('base64');
}

const PNG = png();
const WAV = wav();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (t) => ({ type: 'text', text: t });
const NO_ARGUMENTS = { type: 'object', properties: {} };

// ── Tools ──

const TOOLS = [
  { name: 'test_simple_text', description: 'Answers with one text block.', inputSchema: NO_ARGUMENTS },
  { name: 'test_image_content', description: 'Answers with a PNG image block.', inputSchema: NO_ARGUMENTS },
  { name: 'test_audio_content', description: 'Answers with a WAV audio block.', inputSchema: NO_ARGUMENTS },
  { name: 'test_embedded_resource', description: 'Answers with an embedded text resource.', inputSchema: NO_ARGUMENTS },
  {
    name: 'test_multiple_content_types',
    description: 'Answers with a text, an image and an embedded resource block.',
    inputSchema: NO_ARGUMENTS,
  },
  {
    name: 'test_tool_with_logging',
    description: 'Logs three info messages, 50 ms apart, while it runs.',
    inputSchema: NO_ARGUMENTS,
  },
  {
    name: 'test_tool_with_progress',
    description: 'Reports progress 0, 50 and 100 of 100 when the call carries a progress token.',
    inputSchema: NO_ARGUMENTS,
  },
  { name: 'test_error_handling', description: 'Always fails, as a tool error (isError).', inputSchema: NO_ARGUMENTS },
  {
    name: 'test_sampling',
    description: "Asks the client's model to answer a prompt.",
    inputSchema: {
      type: 'object',
      properties: { prompt: { type: 'string', description: 'What to ask the model' } },
      required: ['prompt'],
    },
  },
  {
    name: 'test_elicitation',
    description: "Asks the client's user for a user name and an email address.",
    inputSchema: {
      type: 'object',
      properties: { message: { type: 'string', description: 'What to tell the user' } },
      required: ['message'],
    },
  },
  {
    name: 'test_elicitation_sep1034_defaults',
    description: 'Asks the user a form whose every primitive field has a default (SEP-1034).',
    inputSchema: NO_ARGUMENTS,
  },
  {
    name: 'test_elicitation_sep1330_enums',
    description: 'Asks the user a form with each kind of enum field (SEP-1330).',
    inputSchema: NO_ARGUMENTS,
  },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Takes arguments described with JSON Schema 2020-12 keywords (SEP-1613).',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
      },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
  },
];

const SEP1034_FORM = {
  type: 'object',
  properties: {
    name: { type: 'string', title: 'Name', default: 'John Doe' },
    age: { type: 'integer', title: 'Age', default: 30 },
    score: { type: 'number', title: 'Score', default: 95.5 },
    status: { type: 'string', title: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
    verified: { type: 'boolean', title: 'Verified', default: true },
  },
};

const SEP1330_FORM = {
  type: 'object',
  properties: {
    untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
    titledSingle: {
      type: 'string',
      oneOf: [
        { const: 'value1', title: 'First Option' },
        { const: 'value2', title: 'Second Option' },
        { const: 'value3', title: 'Third Option' },
      ],
    },
    legacyEnum: {
      type: 'string',
      enum: ['opt1', 'opt2', 'opt3'],
      enumNames: ['Option One', 'Option Two', 'Option Three'],
    },
    untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
    titledMulti: {
      type: 'array',
      items: {
        anyOf: [
          { const: 'value1', title: 'First Choice' },
          { const: 'value2', title: 'Second Choice' },
          { const: 'value3', title: 'Third Choice' },
        ],
      },
    },
  },
};

// ── Resources and prompts ──

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', description: 'A fixed text.', mimeType: 'text/plain' },
  { uri: 'test://static-binary', name: 'static-binary', description: 'A fixed PNG image.', mimeType: 'image/png' },
  {
    uri: 'test://watched-resource',
    name: 'watched-resource',
    description: 'A text one may subscribe to.',
    mimeType: 'text/plain',
  },
];
const TEMPLATE = /^test:\/\/template\/([^/]+)\/data$/;

function readResource(uri) {
  if (uri === 'test://static-text') {
    return [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }];
  }
  if (uri === 'test://static-binary') {
    return [{ uri, mimeType: 'image/png', blob: PNG }];
  }
  if (uri === 'test://watched-resource') {
    return [{ uri, mimeType: 'text/plain', text: 'The watched resource, as it is now.' }];
  }
  const match = TEMPLATE.exec(uri);
  if (match) {
    const id = decodeURIComponent(match[1]);
    return [{ uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }];
  }
  throw new types.McpError(-32002, `no resource at ${uri}`, { uri });
}

const PROMPTS = [
  { name: 'test_simple_prompt', description: 'A prompt without arguments.' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt that repeats its two arguments.',
    arguments: [
      { name: 'arg1', description: 'The first argument', required: true },
      { name: 'arg2', description: 'The second argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt that embeds the resource it is given.',
    arguments: [{ name: 'resourceUri', description: 'The address of the resource to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt that shows an image.' },
];

function getPrompt(name, args) {
  const user = (content) => ({ role: 'user', content });
  switch (name) {
    case 'test_simple_prompt':
      return { messages: [user(text('This is a simple prompt for testing.'))] };
    case 'test_prompt_with_arguments':
      return { messages: [user(text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`))] };
    case 'test_prompt_with_embedded_resource':
      return {
        messages: [
          user({
            type: 'resource',
            resource: { uri: args.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
          }),
          user(text('Please process the embedded resource above.')),
        ],
      };
    case 'test_prompt_with_image':
      return {
        messages: [user({ type: 'image', data: PNG, mimeType: 'image/png' }), user(text('Please analyze the image above.'))],
      };
    default:
      throw new types.McpError(types.ErrorCode.InvalidParams, `no prompt named ${name}`);
  }
}

const COMPLETIONS = { arg1: ['paris', 'park', 'party'], arg2: ['tea', 'test', 'text'] };

// ── One MCP server per session ──

const LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'];

function makeServer() {
  const server = new Server(
    { name: 'gate-conformance-target', version: '1.0.0' },
    {
      capabilities: {
        tools: {},
        resources: { subscribe: true },
        prompts: {},
        completions: {},
        logging: {},
      },
    },
  );
  let level = 'debug';
  const subscriptions = new Set();

  server.setRequestHandler(types.SetLevelRequestSchema, async (request) => {
    level = request.params.level;
    return {};
  });
  // A log message tied to the request it belongs to (on HTTP, on that request's stream).
  const log = async (extra, severity, data) => {
    if (LEVELS.indexOf(severity) >= LEVELS.indexOf(level)) {
      await extra.sendNotification({ method: 'notifications/message', params: { level: severity, logger: 'target', data } });
    }
  };

  server.setRequestHandler(types.ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(types.CallToolRequestSchema, async (request, extra) => {
    const args = request.params.arguments ?? {};
    const capabilities = server.getClientCapabilities() ?? {};
    const elicit = async (message, requestedSchema) => {
      if (!capabilities.elicitation) {
        return { isError: true, content: [text('the client does not take elicitation requests')] };
      }
      const answer = await extra.sendRequest(
        { method: 'elicitation/create', params: { message, requestedSchema } },
        types.ElicitResultSchema,
      );
      return { content: [text(`Elicitation completed: action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`)] };
    };
    switch (request.params.name) {
      case 'test_simple_text':
        return { content: [text('This is a simple text response for testing.')] };
      case 'test_image_content':
        return { content: [{ type: 'image', data: PNG, mimeType: 'image/png' }] };
      case 'test_audio_content':
        return { content: [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }] };
      case 'test_embedded_resource':
        return {
          content: [
            {
              type: 'resource',
              resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
            },
          ],
        };
      case 'test_multiple_content_types':
        return {
          content: [
            text('Multiple content types test:'),
            { type: 'image', data: PNG, mimeType: 'image/png' },
            {
              type: 'resource',
              resource: {
                uri: 'test://mixed-content-resource',
                mimeType: 'application/json',
                text: JSON.stringify({ test: 'data', value: 123 }),
              },
            },
          ],
        };
      case 'test_tool_with_logging':
        await log(extra, 'info', 'Tool execution started');
        await sleep(50);
        await log(extra, 'info', 'Tool processing data');
        await sleep(50);
        await log(extra, 'info', 'Tool execution completed');
        return { content: [text('Logged three messages.')] };
      case 'test_tool_with_progress': {
        const token = request.params._meta?.progressToken;
        for (const progress of [0, 50, 100]) {
          if (progress > 0) await sleep(50);
          if (token !== undefined) {
            await extra.sendNotification({
              method: 'notifications/progress',
              params: { progressToken: token, progress, total: 100 },
            });
          }
        }
        return { content: [text(token === undefined ? 'Done, without a progress token.' : 'Done, progress reported.')] };
      }
      case 'test_error_handling':
        return { isError: true, content: [text('This tool intentionally returns an error for testing')] };
      case 'test_sampling': {
        if (!capabilities.sampling) {
          return { isError: true, content: [text('the client does not take sampling requests')] };
        }
        const answer = await extra.sendRequest(
          {
            method: 'sampling/createMessage',
            params: { messages: [{ role: 'user', content: text(String(args.prompt ?? '')) }], maxTokens: 100 },
          },
          types.CreateMessageResultSchema,
        );
        const said = answer.content?.type === 'text' ? answer.content.text : JSON.stringify(answer.content);
        return { content: [text(`LLM response: ${said}`)] };
      }
      case 'test_elicitation': {
        const form = {
          type: 'object',
          properties: {
            username: { type: 'string', description: "User's response" },
            email: { type: 'string', description: "User's email address" },
          },
          required: ['username', 'email'],
        };
        return elicit(String(args.message ?? ''), form);
      }
      case 'test_elicitation_sep1034_defaults':
        return elicit('Please confirm or change these values.', SEP1034_FORM);
      case 'test_elicitation_sep1330_enums':
        return elicit('Please choose.', SEP1330_FORM);
      case 'json_schema_2020_12_tool':
        return { content: [text(`Received ${JSON.stringify(args)}`)] };
      default:
        throw new types.McpError(types.ErrorCode.InvalidParams, `no tool named ${request.params.name}`);
    }
  });

  server.setRequestHandler(types.ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(types.ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [
      {
        uriTemplate: 'test://template/{id}/data',
        name: 'template-data',
        description: 'The data of one id.',
        mimeType: 'application/json',
      },
    ],
  }));
  server.setRequestHandler(types.ReadResourceRequestSchema, async (request) => ({
    contents: readResource(request.params.uri),
  }));
  server.setRequestHandler(types.SubscribeRequestSchema, async (request) => {
    subscriptions.add(request.params.uri);
    return {};
  });
  server.setRequestHandler(types.UnsubscribeRequestSchema, async (request) => {
    subscriptions.delete(request.params.uri);
    return {};
  });

  server.setRequestHandler(types.ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(types.GetPromptRequestSchema, async (request) =>
    getPrompt(request.params.name, request.params.arguments ?? {}),
  );
  server.setRequestHandler(types.CompleteRequestSchema, async (request) => {
    const { ref, argument } = request.params;
    const known = ref.type === 'ref/prompt' && ref.name === 'test_prompt_with_arguments' ? COMPLETIONS[argument.name] ?? [] : [];
    const values = known.filter((value) => value.startsWith(argument.value));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  return server;
}

// ── Transports ──

if (process.argv.includes('--stdio')) {
  await makeServer().connect(new StdioServerTransport());
} else {
  const port = Number(option('--http'));
  if (!Number.isInteger(port) || port <= 0) {
    console.error('conformance-server: give --stdio, or --http PORT');
    process.exit(2);
  }
  serveHttp(port);
}

// A page on another site whose name resolves to this machine (DNS rebinding) must not
// reach the server: Host and Origin, when present, must name this machine.
function local(hostAndPort) {
  try {
    const host = new URL(`http://${hostAndPort}`).hostname;
    return host === 'localhost' || host === '127.0.0.1' || host === '[::1]';
  } catch {
    return false;
  }
}

function serveHttp(port) {
  const sessions = new Map();
  const refuse = (res, status, message) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message } }));
  };
  const http = createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://localhost');
      if (url.pathname !== '/mcp') return refuse(res, 404, 'not found: the endpoint is /mcp');
      const origin = req.headers.origin;
      if (!local(req.headers.host ?? '') || (origin !== undefined && !local(origin.replace(/^https?:\/\//, '')))) {
        return refuse(res, 403, 'refused: Host and Origin must name this machine');
      }
      let body;
      if (req.method === 'POST') {
        const chunks = [];
        for await (const chunk of req) chunks.push(chunk);
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch {
          return refuse(res, 400, 'the body is not JSON');
        }
      }
      const id = req.headers['mcp-session-id'];
      let transport = typeof id === 'string' ? sessions.get(id) : undefined;
      if (typeof id === 'string' && !transport) return refuse(res, 404, 'no such session');
      if (!transport) {
        if (req.method !== 'POST' || !types.isInitializeRequest(body)) {
          return refuse(res, 400, 'no session: begin with initialize');
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (sessionId) => sessions.set(sessionId, transport),
        });
        transport.onclose = () => {
          if (transport.sessionId) sessions.delete(transport.sessionId);
        };
        await makeServer().connect(transport);
      }
      await transport.handleRequest(req, res, body);
    } catch (error) {
      if (!res.headersSent) refuse(res, 500, String(error));
      else res.end();
    }
  });
  http.listen(port, '127.0.0.1', () => {
    console.log(`conformance-server: listening at http://127.0.0.1:${port}/mcp`);
  });
}
