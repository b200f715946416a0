// A deliberately lenient upstream behind the gateway, on Node's own HTTP
// server: it routes the way the most forgiving frameworks do, so that any
// path or header trick that gets past the gateway shows up as the wrong
// handler running. Same rules and output as lenient_upstream.py (WSGI):
// /admin paths or the host admin.gw.test run the "admin" handler.
//
// usage: node lenient_upstream.js LOG   (prints "READY <port>"; one JSON
// line per request is appended to LOG and returned as the body)
'use strict';
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

const { record } = require('./record');

const log = process.argv[2];
const server = http.createServer((req, res) => {
  const routedBy = req.headers['x-original-url'] || req.headers['x-rewrite-url'];
  const p = lenient(routedBy || req.url);
  const admin = p === '/admin' || p.startsWith('/admin/') || lenientHost(req) === 'admin.gw.test';
  record(log, req, 'node', admin ? 'admin' : 'public', req.url, (line) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(line) });
    res.end(line);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(`READY ${server.address().port}`);
});
