// A deliberately lenient upstream behind the gateway, on Node's own HTTP
// server: it routes the way the most forgiving frameworks do, so that any
// path or header trick that gets past the gateway shows up as the wrong
// handler running. Same rules and output as lenient_upstream.py (WSGI):
// /admin paths or the host admin.gw.test run the "admin" handler.
//
// usage: node lenient_upstream.js LOG   (prints "READY <port>"; one JSON
// line per request is appended to LOG and returned as the body)
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');

function decode(p) {
  try {
    return decodeURIComponent(p);
  } catch (e) {
    return unescape(p);
  }
}

function lenient(raw) {
  let p = decode(decode(raw.split('?')[0]));
  p = p.replace(/\\/g, '/');
  const segments = p.split('/').map((s) => s.split(';')[0]).filter((s) => s);
  // A format suffix on the last segment is dropped (Rails' `(.:format)`).
  p = path.posix.normalize('/' + segments.join('/')).replace(/([^/])\.[A-Za-z0-9]+$/, '$1');
  // Case ignored character by character, upper then lower case, as Java's
  // equalsIgnoreCase does: `ı`, `ſ` and the Kelvin sign read as i, s, k.
  return Array.from(p).map((c) => c.toUpperCase().toLowerCase()).join('');
}

function lenientHost(req) {
  let host = String(req.headers['x-forwarded-host'] || req.headers.host || '');
  host = host.split(',').pop().trim().toLowerCase();
  if (!host.endsWith(']')) host = host.replace(/:[^:]*$/, '');
  return host.replace(/\.+$/, '');
}

// Headers of upstream meta-data that a client must never get through the
// gateway (folded names; the gateway's list is longer).
const META = new Set([
  'script-name', 'path-info', 'remote-user', 'remote-addr', 'auth-type', 'request-uri',
  'server-name', 'x-script-name', 'x-scheme', 'remote-groups', 'x-remote-user',
  'x-remote-addr', 'x-originating-ip', 'x-envoy-original-path', 'x-original-method',
  'x-webauth-user', 'x-ssl-client-cert',
]);

const log = process.argv[2];
const server = http.createServer((req, res) => {
  const routedBy = req.headers['x-original-url'] || req.headers['x-rewrite-url'];
  const p = lenient(routedBy || req.url);
  const admin = p === '/admin' || p.startsWith('/admin/') || lenientHost(req) === 'admin.gw.test';
  const handler = admin ? 'admin' : 'public';
  const identity = {};
  const forwarding = {};
  const meta = {};
  for (const [k, v] of Object.entries(req.headers)) {
    const name = k.replace(/[^a-z0-9]/g, '-');
    if (name.startsWith('x-auth-')) {
      identity[name] = identity[name] ? identity[name] + ',' + v : String(v);
    } else if (name.startsWith('x-forwarded') ||
               ['forwarded', 'x-real-ip', 'x-original-url', 'x-rewrite-url', 'x-http-method-override'].includes(name)) {
      forwarding[name] = String(v);
    } else if (META.has(name)) {
      meta[name] = String(v);
    }
  }
  let body = 0;
  req.on('data', (c) => { body += c.length; });
  req.on('end', () => {
    const line = JSON.stringify({
      stack: 'node', handler, method: req.method, path: req.url, identity, forwarding, meta, body,
    });
    fs.appendFileSync(log, line + '\n');
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(line) });
    res.end(line);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(`READY ${server.address().port}`);
});
