// k6 script of the gateway benchmark: an open model (constant-arrival-rate)
// of GETs with a bearer token picked at random from TOKENS_FILE.
//   k6 run -e URL=http://127.0.0.1:8000/ -e TOKENS_FILE=tokens.txt -e RATE=5000 -e DURATION=30 rate.js
import http from 'k6/http';

const tokens = open(__ENV.TOKENS_FILE).split('\n').filter((l) => l.trim().length > 0);

export const options = {
  discardResponseBodies: true,
  scenarios: {
    rate: {
      executor: 'constant-arrival-rate',
      rate: Number(__ENV.RATE || 5000),
      timeUnit: '1s',
      duration: `${__ENV.DURATION || 30}s`,
      preAllocatedVUs: Number(__ENV.VUS || 300),
      maxVUs: Number(__ENV.MAX_VUS || 2000),
    },
  },
  summaryTrendStats: ['min', 'med', 'avg', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

const params = tokens.map((t) => ({ headers: { Authorization: `Bearer ${t}` } }));

export default function () {
  http.get(__ENV.URL, params[Math.floor(Math.random() * params.length)]);
}
