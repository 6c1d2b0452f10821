// Shared helpers for the k6 scenarios: MCP-over-HTTP requests and sessions.
import http from 'k6/http';

export const HEADERS = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' };

const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0', id: 0, method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'k6', version: '1' } },
});

// Opens a session; returns its id ('' for a stateless server, which issues none).
export function initialize(url) {
  const r = http.post(url, INITIALIZE, { headers: HEADERS });
  if (r.status !== 200) {
    throw new Error(`initialize answered ${r.status}: ${r.body}`);
  }
  return r.headers['Mcp-Session-Id'] || '';
}

// Headers for a request in `session`.
export function sessionHeaders(session) {
  if (!session) return HEADERS;
  return Object.assign({ 'Mcp-Session-Id': session, 'Mcp-Protocol-Version': '2025-11-25' }, HEADERS);
}

export function callBody(tool, args) {
  return JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: tool, arguments: args } });
}
