#!/usr/bin/env node
// Minimal MCP client on the TypeScript SDK 2.x split package (@modelcontextprotocol/client@2.4.0).
//
// Usage:
//   node sdk_client.mjs --mode auto|legacy|2026-07-28 \
//     (--url URL [--header 'Name: value']... | --command CMD [ARGS...]) \
//     --call TOOL --args JSON
//
// Connects (Streamable HTTP for --url, stdio for --command), lists tools, calls one tool and
// prints {"tools":[names],"result":<CallToolResult>,"era":..,"protocolVersion":..} on stdout.
// Any failure (connect, list, call, or a result with isError:true) prints {"error":...} to
// stderr and exits 1. Bad usage exits 2.
//
// Era selection is ClientOptions.versionNegotiation.mode (see dist/client-*.d.mts):
//   'legacy'            -> plain 2025 initialize handshake (the SDK default)
//   'auto'              -> probe with server/discover, fall back to initialize
//   { pin: '2026-07-28' } -> stateless 2026-07-28 era only; fails if discover does not offer it
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

function usage(msg) {
  process.stderr.write(`${msg}\nusage: sdk_client.mjs --mode auto|legacy|2026-07-28 ` +
    `(--url URL [--header 'K: V']... | --command CMD ARGS...) --call TOOL --args JSON\n`);
  process.exit(2);
}

// --- argument parsing: --command swallows everything up to the next known flag ---
const FLAGS = new Set(['--mode', '--url', '--header', '--command', '--call', '--args']);
const opt = { mode: 'auto', headers: {}, argsJson: '{}' };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const next = () => (i + 1 < argv.length ? argv[++i] : usage(`missing value for ${a}`));
  if (a === '--mode') opt.mode = next();
  else if (a === '--url') opt.url = next();
  else if (a === '--header') {
    const h = next(); const c = h.indexOf(':');
    if (c < 1) usage(`bad header: ${h}`);
    opt.headers[h.slice(0, c).trim()] = h.slice(c + 1).trim();
  } else if (a === '--command') {
    opt.command = next(); opt.cmdArgs = [];
    while (i + 1 < argv.length && !FLAGS.has(argv[i + 1])) opt.cmdArgs.push(argv[++i]);
  } else if (a === '--call') opt.tool = next();
  else if (a === '--args') opt.argsJson = next();
  else usage(`unknown argument: ${a}`);
}
if (!opt.url === !opt.command) usage('exactly one of --url / --command is required');
if (!opt.tool) usage('--call is required');

const modes = { auto: 'auto', legacy: 'legacy' };
const mode = modes[opt.mode] ?? (/^\d{4}-\d{2}-\d{2}$/.test(opt.mode) ? { pin: opt.mode } : usage(`bad --mode ${opt.mode}`));

async function main() {
  const toolArgs = JSON.parse(opt.argsJson);
  const transport = opt.url
    ? new StreamableHTTPClientTransport(new URL(opt.url), { requestInit: { headers: opt.headers } })
    : new StdioClientTransport({ command: opt.command, args: opt.cmdArgs, stderr: 'inherit' });
  const client = new Client({ name: 'switchboard-tests', version: '0.1.0' },
    { versionNegotiation: { mode } });
  try {
    await client.connect(transport);
    const { tools } = await client.listTools();
    const result = await client.callTool({ name: opt.tool, arguments: toolArgs });
    const out = {
      tools: tools.map((t) => t.name),
      result,
      era: client.getProtocolEra(),                       // 'legacy' | 'modern'
      protocolVersion: client.getNegotiatedProtocolVersion(),
    };
    process.stdout.write(JSON.stringify(out) + '\n');
    return result.isError ? 1 : 0;
  } finally {
    await client.close().catch(() => {});
  }
}

main().then((code) => process.exit(code), (err) => {
  let cause;                                    // innermost cause, e.g. ECONNREFUSED behind 'fetch failed'
  for (let c = err?.cause ?? err?.data?.cause; c && c !== cause; c = c.cause ?? c.data?.cause) cause = c;
  const e = { error: String(err?.message ?? err), name: err?.name, code: err?.code, data: err?.data,
    cause: cause ? String(cause.message ?? cause.code ?? cause) : undefined };
  process.stderr.write(JSON.stringify(e) + '\n');
  process.exit(1);
});
