// tools/list from the router's cache, e.g. with 50 upstreams behind it.
//   k6 run -e URL=... -e VUS=8 -e DURATION=10s loadtest/tools_list.js
import http from 'k6/http';
import { check } from 'k6';
import { initialize, sessionHeaders } from './lib.js';

const URL = __ENV.URL || 'http://127.0.0.1:8080/mcp';
const BODY = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' });

export const options = {
  vus: Number(__ENV.VUS || 8),
  duration: __ENV.DURATION || '10s',
  summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'],
  thresholds: { checks: ['rate>0.99'] },
};

export function setup() {
  return { session: initialize(URL) };
}

export default function (data) {
  const r = http.post(URL, BODY, { headers: sessionHeaders(data.session) });
  check(r, {
    'status is 200': (res) => res.status === 200,
    'has tools': (res) => res.body && res.body.indexOf('"tools":[') > 0,
  });
}
