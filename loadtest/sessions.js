// Many live sessions: setup opens SESSIONS sessions (default 10,000); then
// VUS users ping random ones for DURATION, keeping them alive.
//   k6 run -e URL=... -e SESSIONS=10000 -e DURATION=10s loadtest/sessions.js
import http from 'k6/http';
import { check } from 'k6';
import { HEADERS, sessionHeaders } from './lib.js';

const URL = __ENV.URL || 'http://127.0.0.1:8080/mcp';
const SESSIONS = Number(__ENV.SESSIONS || 10000);
const INITIALIZE = JSON.stringify({
  jsonrpc: '2.0', id: 0, method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'k6', version: '1' } },
});
const PING = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' });

export const options = {
  vus: Number(__ENV.VUS || 8),
  duration: __ENV.DURATION || '10s',
  setupTimeout: '300s',
  discardResponseBodies: false,
  summaryTrendStats: ['avg', 'p(50)', 'p(99)', 'max'],
  thresholds: { checks: ['rate>0.99'] },
};

export function setup() {
  const sessions = [];
  while (sessions.length < SESSIONS) {
    const n = Math.min(100, SESSIONS - sessions.length);
    const batch = [];
    for (let i = 0; i < n; i++) batch.push(['POST', URL, INITIALIZE, { headers: HEADERS }]);
    for (const r of http.batch(batch)) {
      if (r.status !== 200) throw new Error(`initialize answered ${r.status}`);
      sessions.push(r.headers['Mcp-Session-Id']);
    }
  }
  return { sessions };
}

export default function (data) {
  const session = data.sessions[Math.floor(Math.random() * data.sessions.length)];
  const r = http.post(URL, PING, { headers: sessionHeaders(session) });
  check(r, { 'status is 200': (res) => res.status === 200 });
}
