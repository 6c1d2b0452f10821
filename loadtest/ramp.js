// Ramp to saturation: the arrival rate rises from START to PEAK calls/s over
// DURATION; watch where latency and dropped iterations climb.
//   k6 run -e URL=... -e TOOL=alpha__echo -e PEAK=20000 -e DURATION=30s loadtest/ramp.js
import http from 'k6/http';
import { check } from 'k6';
import { initialize, sessionHeaders, callBody } from './lib.js';

const URL = __ENV.URL || 'http://127.0.0.1:8080/mcp';
const BODY = callBody(__ENV.TOOL || 'alpha__echo', { text: 'hello' });
const START = Number(__ENV.START || 500);
const PEAK = Number(__ENV.PEAK || 20000);

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'],
  scenarios: {
    ramp: {
      executor: 'ramping-arrival-rate',
      startRate: START,
      timeUnit: '1s',
      preAllocatedVUs: Number(__ENV.VUS || 64),
      maxVUs: Number(__ENV.MAX_VUS || 256),
      stages: [{ target: PEAK, duration: __ENV.DURATION || '30s' }],
    },
  },
};

export function setup() {
  return { session: initialize(URL) };
}

export default function (data) {
  const r = http.post(URL, BODY, { headers: sessionHeaders(data.session) });
  check(r, { 'status is 200': (res) => res.status === 200 });
}
