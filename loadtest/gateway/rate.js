// k6 script of the gateway benchmark: an open model (constant-arrival-rate)
// of GETs with a bearer token picked at random from TOKENS_FILE.
//   GOGC=off k6 run -e URL=http://127.0.0.1:8000/ -e TOKENS_FILE=/abs/tokens.txt \
//       -e RATE=5000 -e DURATION=30 rate.js
// On 2 cores, k6 itself needs ~0.9 core at 5,000/s; with Go's default GC its
// pauses alone put ~50 ms into the P99 of the upstream measured directly, so
// loadtest/gateway_bench.py sets GOGC=off (about 1 GB per 15 s at this rate)
// and the script keeps only the `status` tag, which brings the direct P99 to
// ~1.3 ms.
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
  systemTags: ['status'],
  summaryTrendStats: ['min', 'med', 'avg', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

const params = tokens.map((t) => ({ headers: { Authorization: `Bearer ${t}` } }));

export default function () {
  http.get(__ENV.URL, params[Math.floor(Math.random() * params.length)]);
}
