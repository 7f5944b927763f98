// The conformance suite's CLIENT scenarios in `cargo xtask e2e`, with `gate` as the MCP
// client: the command the suite runs for a scenario (`conformance client --command ...`).
// The suite starts the scenario's test server and runs this with that server's URL as the
// last argument and the scenario's name in MCP_CONFORMANCE_SCENARIO. This script then does
// what a person and an agent would:
//
//   - the person: writes a gate.toml in a scratch directory with the scenario's server as a
//     downstream `url = ...` server, lists as `reads = [...]` the tools the person would
//     (the scenario servers annotate none, so the gate would otherwise stage every call as
//     a write for approval), turns on `forward_elicitation` where the scenario's server asks
//     the client a question, and starts `gate serve` on it;
//   - the agent: connects to the gate over streamable HTTP with its token (the official
//     TypeScript SDK client), lists the tools, calls the scenario's tool and checks what
//     comes back (answering an elicitation by accepting with the schema's defaults);
//
// so that the gate, as the MCP client of the scenario's server, does what the scenario
// checks. In the authorization scenarios (`auth/*`) the server asks for OAuth: the
// configuration gets an `[server.oauth]` table (with the scenario's client id, secret or
// signing key where it gives them), and the person runs `gate login suite` before
// `gate serve`, with this script as the browser, and again whenever the gate tells the
// agent that the person must (step-up), at most three times; for a client of its own
// (client credentials) nobody logs in. Where the login must be refused (a resource or an
// issuer that does not match), the script checks that it was, and for the reason. Then it stops the gate (SIGTERM to the pid it started, then SIGKILL) and exits 0
// when the agent saw what it expected, 1 otherwise (what went wrong on stderr; the gate's
// log is kept in the scratch directory).
//
//   GATE_BIN=/path/to/gate GATE_SDK_MODULES=/path/to/node_modules \
//   GATE_CLIENT_WORK=/scratch/dir node conformance-client.mjs SERVER_URL

import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

/** How long `gate serve` may take to say where it listens. */
const LISTEN_LIMIT_MS = 20_000;
/** How long the gate may take to exit after SIGTERM. */
const STOP_LIMIT_MS = 10_000;
/** The downstream server's name in the gate: its tools are `suite__<tool>`. */
const SERVER = 'suite';

/**
 * What each scenario that applies needs: the tools the person lists as reads, whether the
 * server's questions may reach the agent, and what the agent does through the gate.
 */
const SCENARIOS = {
  // The gate initializes the server when it starts; the agent lists what it offers (none).
  initialize: { reads: [], elicitation: false, drive: listOnly },
  tools_call: { reads: ['add_numbers'], elicitation: false, drive: addNumbers },
  'elicitation-sep1034-client-defaults': {
    reads: ['test_client_elicitation_defaults'],
    elicitation: true,
    drive: elicitationDefaults,
  },
  'sse-retry': { reads: ['test_reconnection'], elicitation: false, drive: reconnection },
};

// The authorization scenarios: the scenario's server asks for OAuth, so the person runs
// `gate login suite` before `gate serve` (this script plays the browser: it fetches the
// authorization address the gate printed and follows its redirect to the gate's loopback
// port), and again when the gate tells the agent that the person must (a server asking
// for more scope), at most MAX_LOGINS times in all. The agent calls the server's one tool.
const MAX_LOGINS = 3;
const auth = (extra = {}) => ({ reads: ['test-tool'], elicitation: false, drive: testTool, oauth: {}, ...extra });
for (const name of [
  'metadata-default', 'metadata-var1', 'metadata-var2', 'metadata-var3',
  'scope-from-www-authenticate', 'scope-from-scopes-supported', 'scope-omitted-when-undefined',
  'token-endpoint-auth-basic', 'token-endpoint-auth-post', 'token-endpoint-auth-none',
  '2025-03-26-oauth-metadata-backcompat', '2025-03-26-oauth-endpoint-fallback',
  'offline-access-scope', 'offline-access-not-supported',
]) SCENARIOS[`auth/${name}`] = auth();
// The gate's client ID metadata document, where the authorization server supports them.
SCENARIOS['auth/basic-cimd'] = auth({ oauth: { client_metadata_url: 'https://conformance-test.local/client-metadata.json' } });
// A client registered by hand: its id and secret come with the scenario.
SCENARIOS['auth/pre-registration'] = auth({ oauth: 'context' });
// The gate as a client of its own (a service account): no login, the gate gets its token.
SCENARIOS['auth/client-credentials-basic'] = auth({ oauth: 'context', grant: 'client_credentials' });
// The same with a signed assertion (private_key_jwt) instead of a secret.
SCENARIOS['auth/client-credentials-jwt'] = auth({ oauth: 'context', grant: 'client_credentials' });
// The server's metadata names another resource: the login must be refused, and nothing
// reaches the server with a token.
SCENARIOS['auth/resource-mismatch'] = auth({ loginRefused: /resource/i });
// Authorization server metadata whose issuer is not the URL it was found at (RFC 8414
// section 3.3): refused, so nothing is registered or asked for.
SCENARIOS['auth/2025-03-26-oauth-metadata-backcompat'] = auth({ loginRefused: /issuer mismatch/i });
// More scope for the call than for the listing: the agent is told the person must log in
// again, the person does, and the call goes through.
SCENARIOS['auth/scope-step-up'] = auth();
// A server that never accepts any scope: the person gives up after MAX_LOGINS logins.
SCENARIOS['auth/scope-retry-limit'] = auth({ drive: neverEnough, givesUp: true });

function need(name) {
  const value = process.env[name];
  if (!value) fail(`${name} must be set`);
  return value;
}

function fail(why) {
  console.error(`conformance-client: ${why}`);
  process.exit(1);
}

const scenarioName = need('MCP_CONFORMANCE_SCENARIO');
const scenario = SCENARIOS[scenarioName];
if (!scenario) fail(`scenario ${JSON.stringify(scenarioName)} is not one this wrapper drives`);
const serverUrl = process.argv.at(-1);
if (!/^http:\/\/[^/\s]+/.test(serverUrl ?? '')) fail(`the last argument must be the server's http URL, not ${serverUrl}`);
const gateBin = need('GATE_BIN');
const modules = need('GATE_SDK_MODULES');
const work = need('GATE_CLIENT_WORK');

const sdk = (path) => import(pathToFileURL(join(modules, '@modelcontextprotocol', 'sdk', 'dist', 'esm', path)).href);
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');
const { ElicitRequestSchema } = await sdk('types.js');

/** A TOML basic string. */
const toml = (text) => JSON.stringify(String(text));

/** A loopback port nothing listens on right now. */
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

// ── The person: the configuration and `gate serve` ──

rmSync(work, { recursive: true, force: true });
for (const sub of ['home', 'config/gate', 'data']) mkdirSync(join(work, sub), { recursive: true });
const token = randomBytes(24).toString('hex');
const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT || '{}');
const oauthLines = [];
if (scenario.oauth === 'context') {
  oauthLines.push('[server.oauth]', `client_id = ${toml(context.client_id)}`);
  if (context.private_key_pem) {
    if (context.signing_algorithm && context.signing_algorithm !== 'ES256') fail(`the gate signs with ES256, not ${context.signing_algorithm}`);
    const keyFile = join(work, 'client-key.pem');
    writeFileSync(keyFile, context.private_key_pem, { mode: 0o600 });
    oauthLines.push(`private_key_file = ${toml(keyFile)}`);
  } else {
    oauthLines.push('client_secret_env = "SUITE_CLIENT_SECRET"');
  }
  if (scenario.grant) oauthLines.push(`grant = ${toml(scenario.grant)}`);
} else if (scenario.oauth) {
  oauthLines.push('[server.oauth]', ...Object.entries(scenario.oauth).map(([k, v]) => `${k} = ${toml(v)}`));
}
const config = [
  '# Written by xtask/e2e/conformance-client.mjs for the conformance scenario',
  `# ${scenarioName}: its test server is a downstream server reached by url.`,
  `listen = "127.0.0.1:${await freePort()}"`,
  '',
  '[[server]]',
  `name = "${SERVER}"`,
  `url = ${toml(serverUrl)}`,
  `reads = [${scenario.reads.map(toml).join(', ')}]`,
  ...(scenario.elicitation ? ['forward_elicitation = true'] : []),
  'deadline_seconds = 20',
  ...oauthLines,
  '',
  '[[agent]]',
  'name = "agent"',
  `token = "${token}"`,
  '',
  '[[agent.grant]]',
  `server = "${SERVER}"`,
  '',
].join('\n');
writeFileSync(join(work, 'config/gate/gate.toml'), config, { mode: 0o600 });

const gateEnv = {
  ...process.env,
  HOME: join(work, 'home'),
  XDG_CONFIG_HOME: join(work, 'config'),
  XDG_DATA_HOME: join(work, 'data'),
  RUST_LOG: 'info',
  NO_COLOR: '1',
  ...(context.client_secret ? { SUITE_CLIENT_SECRET: context.client_secret } : {}),
};

let logins = 0;
/**
 * The person's `gate login suite`, with this script as the browser: the authorization
 * address the gate prints is fetched, and its redirect (the authorization server's answer)
 * is delivered to the gate's loopback port. Whether the login succeeded, and what it said.
 */
async function login() {
  logins += 1;
  const child = spawn(gateBin, ['login', SERVER, '--no-browser', '--wait-seconds', '20'], {
    env: gateEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let said = '';
  child.stderr.on('data', (chunk) => { said += chunk; });
  const done = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  let browsed = false;
  child.stdout.on('data', async (chunk) => {
    said += chunk;
    const address = /^ {2}(https?:\/\/\S+)$/m.exec(said)?.[1];
    if (!address || browsed) return;
    browsed = true;
    try {
      const answer = await fetch(address, { redirect: 'manual' });
      const back = answer.headers.get('location');
      if (back) await fetch(back);
      else said += `\n(the authorization page answered ${answer.status} with no redirect)`;
    } catch (error) {
      said += `\n(the browser failed: ${error?.message ?? error})`;
    }
  });
  const code = await done;
  return { ok: code === 0, said: said.trim() };
}

if (scenario.oauth !== undefined && !scenario.grant) {
  const first = await login();
  if (scenario.loginRefused) {
    if (first.ok) fail(`gate login accepted metadata it must refuse:\n${first.said}`);
    if (!scenario.loginRefused.test(first.said)) fail(`gate login failed, but not for the reason it must (${scenario.loginRefused}):\n${first.said}`);
    console.log(`conformance-client: ${scenarioName}: gate login refused, as it must:\n${first.said}`);
    process.exit(0);
  }
  if (!first.ok && !scenario.givesUp) fail(`gate login failed:\n${first.said}`);
}

const log = join(work, 'serve.log');
const gate = spawn(gateBin, ['serve'], {
  env: gateEnv,
  stdio: ['ignore', 'pipe', openSync(log, 'w')],
});
const exited = new Promise((resolve) => gate.on('exit', (code, signal) => resolve(signal ?? code)));

/** Stop the gate by its pid: SIGTERM, then SIGKILL if it lingers. */
async function stopGate() {
  if (gate.exitCode !== null || gate.signalCode !== null) return;
  gate.kill('SIGTERM');
  const timer = setTimeout(() => gate.kill('SIGKILL'), STOP_LIMIT_MS);
  await exited;
  clearTimeout(timer);
}

function logTail(lines = 15) {
  try {
    return readFileSync(log, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

const gateUrl = await new Promise((resolve) => {
  let seen = '';
  const timer = setTimeout(() => resolve(null), LISTEN_LIMIT_MS);
  gate.stdout.on('data', (chunk) => {
    seen += chunk;
    const found = /gate: agents at (\S+)/.exec(seen);
    if (found) {
      clearTimeout(timer);
      resolve(found[1]);
    }
  });
  exited.then(() => resolve(null));
});

// ── The agent ──

let outcome;
if (!gateUrl) {
  outcome = `gate serve did not say where it listens within ${LISTEN_LIMIT_MS / 1000} s:\n${logTail()}`;
} else {
  const client = new Client(
    { name: 'conformance-agent', version: '1.0.0' },
    { capabilities: scenario.elicitation ? { elicitation: { form: { applyDefaults: true } } } : {} },
  );
  const transport = new StreamableHTTPClientTransport(new URL(gateUrl), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  try {
    await client.connect(transport);
    outcome = await scenario.drive(client);
  } catch (error) {
    outcome = `the agent's session through the gate failed: ${error?.message ?? error}`;
  } finally {
    await client.close().catch(() => {});
  }
}
await stopGate();
if (outcome) {
  console.error(`conformance-client: ${scenarioName}: ${outcome}`);
  console.error(`conformance-client: the gate's log is ${log}`);
  process.exit(1);
}
console.log(`conformance-client: ${scenarioName}: the agent saw what it expected through the gate`);

// ── What the agent does, per scenario; each returns why it failed, or nothing ──

/** The tool `name` of the scenario's server, as the gate lists it, or why it is missing. */
async function tool(client, name) {
  const { tools } = await client.listTools();
  const named = tools.map((t) => t.name);
  return named.includes(`${SERVER}__${name}`)
    ? null
    : `the gate lists ${JSON.stringify(named)}, not ${SERVER}__${name}`;
}

function text(result) {
  return (result?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

async function listOnly(client) {
  const { tools } = await client.listTools();
  const ours = tools.filter((t) => t.name.startsWith(`${SERVER}__`));
  return ours.length === 0 ? null : `the server offers no tools, yet the gate lists ${ours.map((t) => t.name)}`;
}

async function addNumbers(client) {
  const missing = await tool(client, 'add_numbers');
  if (missing) return missing;
  const result = await client.callTool({ name: `${SERVER}__add_numbers`, arguments: { a: 5, b: 3 } });
  const said = text(result);
  return !result.isError && said.includes('The sum of 5 and 3 is 8') ? null : `the call answered ${JSON.stringify(result)}`;
}

async function elicitationDefaults(client) {
  let asked = 0;
  // Accept with nothing filled in: the SDK client fills in the schema's defaults
  // (`applyDefaults`), and the gate relays the answer to the server untouched.
  client.setRequestHandler(ElicitRequestSchema, async () => {
    asked += 1;
    return { action: 'accept', content: {} };
  });
  const missing = await tool(client, 'test_client_elicitation_defaults');
  if (missing) return missing;
  const result = await client.callTool({ name: `${SERVER}__test_client_elicitation_defaults`, arguments: {} });
  const said = text(result);
  if (asked !== 1) return `the server's question reached the agent ${asked} times, not once (the call answered ${JSON.stringify(said)})`;
  return !result.isError && said.startsWith('Elicitation completed:') ? null : `the call answered ${JSON.stringify(result)}`;
}

/** Whether what the gate answered tells the agent that the person must log in again. */
function loginNeeded(said) {
  return said.includes(`the person must run \`gate login ${SERVER}\``);
}

/** Call the server's tool, the person logging in again when the gate says they must. */
async function testTool(client) {
  for (;;) {
    const result = await client.callTool({ name: `${SERVER}__test-tool`, arguments: {} });
    const said = text(result);
    if (!result.isError && said === 'test') return null;
    if (!loginNeeded(said) || logins >= MAX_LOGINS) return `the call answered ${JSON.stringify(result)}`;
    const again = await login();
    if (!again.ok) return `the login the gate asked for failed:\n${again.said}`;
  }
}

/** A server that wants more scope at every call: the person stops after MAX_LOGINS. */
async function neverEnough(client) {
  while (logins < MAX_LOGINS) {
    const { tools } = await client.listTools();
    const call = tools.some((t) => t.name === `${SERVER}__test-tool`)
      ? text(await client.callTool({ name: `${SERVER}__test-tool`, arguments: {} }))
      : 'the person must run `gate login suite`';
    if (!loginNeeded(call)) return `the gate did not say the person must log in again: ${call}`;
    await login();
  }
  return null;
}

async function reconnection(client) {
  const missing = await tool(client, 'test_reconnection');
  if (missing) return missing;
  const result = await client.callTool({ name: `${SERVER}__test_reconnection`, arguments: {} });
  return !result.isError && text(result).includes('Reconnection test completed successfully')
    ? null
    : `the call answered ${JSON.stringify(result)}`;
}
