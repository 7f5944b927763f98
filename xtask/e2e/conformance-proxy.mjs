// The conformance suite's way through `gate` in `cargo xtask e2e`: a small HTTP proxy in
// front of `gate serve` that undoes what the gateway changes by design, and nothing else.
// The suite talks to a plain MCP server that knows nothing of agents or the gate's names;
// through the gate the same server is one downstream server among several, so:
//
//   - the gate wants the agent's token: every request gets `Authorization: Bearer <token>`
//     (from the environment variable GATE_TOKEN);
//   - the gate names what it offers after its server: tools and prompts are
//     `<server>__<name>` and resources `gate://<server>/<the server's own URI>`; requests get
//     the prefix added (tools/call, prompts/get, completion/complete, resources/read,
//     resources/subscribe, resources/unsubscribe) and answers and notifications have it
//     taken off (the lists, and every `uri` and `uriTemplate` carrying the prefix).
//
// The other documented difference, unannotated tools being writes that wait for a person,
// is undone by the person's own setting, `reads = [...]` in the server's table of the gate's
// configuration that `cargo xtask e2e` writes (xtask/src/e2e.rs, `conformance_config`).
// Everything else (Host, Origin, the session and protocol headers, the bodies' other
// fields, the order and framing of server-sent events) passes as received, so what the
// suite then finds is the gate's own behaviour.
//
//   GATE_TOKEN=... node conformance-proxy.mjs --listen PORT --gate URL --server NAME

import { createServer, request as forward } from 'node:http';

function option(name) {
  const at = process.argv.indexOf(name);
  if (at < 0 || process.argv[at + 1] === undefined) {
    console.error(`conformance-proxy: ${name} is required`);
    process.exit(2);
  }
  return process.argv[at + 1];
}

const port = Number(option('--listen'));
const gate = new URL(option('--gate'));
const server = option('--server');
const token = process.env.GATE_TOKEN;
if (!token) {
  console.error('conformance-proxy: GATE_TOKEN must hold the agent token');
  process.exit(2);
}
const NAME = `${server}__`;
const URI = `gate://${server}/`;

// ── The mapping ──

const named = (name) => (typeof name === 'string' ? NAME + name : name);
const addressed = (uri) => (typeof uri === 'string' ? URI + uri : uri);

/** A message from the suite to the gate: the gate's names in the places requests name things. */
function toGate(message) {
  const params = message?.params;
  if (typeof message?.method !== 'string' || !params || typeof params !== 'object') return message;
  switch (message.method) {
    case 'tools/call':
    case 'prompts/get':
      params.name = named(params.name);
      break;
    case 'resources/read':
    case 'resources/subscribe':
    case 'resources/unsubscribe':
      params.uri = addressed(params.uri);
      break;
    case 'completion/complete':
      if (params.ref?.type === 'ref/prompt') params.ref.name = named(params.ref.name);
      if (params.ref?.type === 'ref/resource') params.ref.uri = addressed(params.ref.uri);
      break;
  }
  return message;
}

/** A message from the gate to the suite: the server's own names back. */
function fromGate(message) {
  const strip = (value) => {
    if (Array.isArray(value)) return value.forEach(strip);
    if (!value || typeof value !== 'object') return;
    for (const [key, inner] of Object.entries(value)) {
      if ((key === 'uri' || key === 'uriTemplate') && typeof inner === 'string' && inner.startsWith(URI)) {
        value[key] = inner.slice(URI.length);
      } else {
        strip(inner);
      }
    }
  };
  const result = message?.result;
  if (result && typeof result === 'object') {
    for (const list of [result.tools, result.prompts]) {
      for (const item of Array.isArray(list) ? list : []) {
        if (typeof item?.name === 'string' && item.name.startsWith(NAME)) item.name = item.name.slice(NAME.length);
      }
    }
    strip(result);
  }
  if (message?.method === 'notifications/resources/updated') strip(message.params);
  return message;
}

const each = (body, map) => (Array.isArray(body) ? body.map(map) : map(body));

// ── HTTP ──

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'authorization']);

function copyHeaders(from) {
  const headers = {};
  for (const [key, value] of Object.entries(from)) {
    if (!HOP_BY_HOP.has(key.toLowerCase())) headers[key] = value;
  }
  return headers;
}

/** Rewrite a stream of server-sent events event by event, passing each on as it ends. */
function relayEvents(upstream, res) {
  let buffer = '';
  let data = [];
  let fields = [];
  const flushEvent = () => {
    if (data.length > 0) {
      let payload = data.join('\n');
      try {
        payload = JSON.stringify(each(JSON.parse(payload), fromGate));
      } catch {
        // Not JSON: passed on as it came.
      }
      fields.push(`data: ${payload}`);
    }
    if (fields.length > 0) res.write(`${fields.join('\n')}\n\n`);
    data = [];
    fields = [];
  };
  upstream.setEncoding('utf8');
  upstream.on('data', (chunk) => {
    buffer += chunk;
    let end;
    while ((end = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer[end] === '\r' ? 2 : 1));
      if (line === '') flushEvent();
      else if (line.startsWith('data:')) data.push(line.slice(line[5] === ' ' ? 6 : 5));
      else fields.push(line);
    }
  });
  upstream.on('end', () => {
    flushEvent();
    res.end();
  });
  upstream.on('error', () => res.destroy());
  res.on('close', () => upstream.destroy());
}

const proxy = createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  let body = Buffer.concat(chunks);
  if (body.length > 0 && (req.headers['content-type'] ?? '').includes('application/json')) {
    try {
      body = Buffer.from(JSON.stringify(each(JSON.parse(body.toString('utf8')), toGate)));
    } catch {
      // Not JSON: the gate says what it makes of it.
    }
  }
  const headers = copyHeaders(req.headers);
  headers.authorization = `Bearer ${token}`;
  if (body.length > 0) headers['content-length'] = String(body.length);
  const upstream = forward(
    { host: gate.hostname, port: gate.port, path: gate.pathname + (new URL(req.url, 'http://x').search), method: req.method, headers },
    (answer) => {
      const type = answer.headers['content-type'] ?? '';
      const out = copyHeaders(answer.headers);
      if (type.includes('text/event-stream')) {
        res.writeHead(answer.statusCode, out);
        res.flushHeaders();
        relayEvents(answer, res);
        return;
      }
      const parts = [];
      answer.on('data', (chunk) => parts.push(chunk));
      answer.on('end', () => {
        let payload = Buffer.concat(parts);
        if (type.includes('application/json') && payload.length > 0) {
          try {
            payload = Buffer.from(JSON.stringify(each(JSON.parse(payload.toString('utf8')), fromGate)));
          } catch {
            // Not JSON: passed on as it came.
          }
        }
        out['content-length'] = String(payload.length);
        res.writeHead(answer.statusCode, out);
        res.end(payload);
      });
    },
  );
  upstream.on('error', (error) => {
    if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`conformance-proxy: the gate did not answer: ${error.message}\n`);
  });
  upstream.end(body);
});

proxy.listen(port, '127.0.0.1', () => {
  console.log(`conformance-proxy: listening at http://127.0.0.1:${port}/mcp`);
});
