// What an upstream of the gateway's attack corpus records of a request:
// the identity, forwarding and upstream meta-data headers that reached it
// (names folded as lighttpd folds them: every character other than a
// letter or digit is the same), the method and the body's length. Shared
// by lenient_upstream.js and express/upstream.js.
'use strict';

// Headers of upstream meta-data that a client must never get through the
// gateway (folded names; the gateway's list is longer).
const META = new Set([
  'script-name', 'path-info', 'remote-user', 'remote-addr', 'auth-type', 'request-uri',
  'server-name', 'x-script-name', 'x-scheme', 'remote-groups', 'x-remote-user',
  'x-remote-addr', 'x-originating-ip', 'x-envoy-original-path', 'x-original-method',
  'x-webauth-user', 'x-ssl-client-cert',
]);

const FORWARDING = ['forwarded', 'x-real-ip', 'x-original-url', 'x-rewrite-url', 'x-http-method-override'];

// The headers of `req` by kind.
function headers(req) {
  const identity = {};
  const forwarding = {};
  const meta = {};
  for (const [k, v] of Object.entries(req.headers)) {
    const name = k.replace(/[^a-z0-9]/g, '-');
    if (name.startsWith('x-auth-')) {
      identity[name] = identity[name] ? identity[name] + ',' + v : String(v);
    } else if (name.startsWith('x-forwarded') || FORWARDING.includes(name)) {
      forwarding[name] = String(v);
    } else if (META.has(name)) {
      meta[name] = String(v);
    }
  }
  return { identity, forwarding, meta };
}

// Reads the body, then calls `done(line)` with the JSON line of the
// request (appended to `log` first).
function record(log, req, stack, handler, path, done) {
  const fs = require('fs');
  const seen = headers(req);
  let body = 0;
  req.on('data', (c) => { body += c.length; });
  req.on('end', () => {
    const line = JSON.stringify({ stack, handler, method: req.method, path, ...seen, body });
    fs.appendFileSync(log, line + '\n');
    done(line);
  });
}

module.exports = { record };
