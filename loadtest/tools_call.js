// Steady load: VUS virtual users call one tool for DURATION.
//   k6 run -e URL=http://127.0.0.1:8080/mcp -e TOOL=alpha__echo -e VUS=32 -e DURATION=10s loadtest/tools_call.js
import http from 'k6/http';
import { check } from 'k6';
import { initialize, sessionHeaders, callBody } from './lib.js';

const URL = __ENV.URL || 'http://127.0.0.1:8080/mcp';
const BODY = callBody(__ENV.TOOL || 'alpha__echo', { text: 'hello' });

export const options = {
  vus: Number(__ENV.VUS || 32),
  duration: __ENV.DURATION || '10s',
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'],
  thresholds: { checks: ['rate>0.99'] },
};

export function setup() {
  return { session: initialize(URL) };
}

export default function (data) {
  const r = http.post(URL, BODY, { headers: sessionHeaders(data.session) });
  check(r, { 'status is 200': (res) => res.status === 200 });
}
