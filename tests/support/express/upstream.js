// An Express application behind the gateway. Express's router matches
// paths without regard to case by default, so `/ADMIN/users` runs the
// handler mounted at /admin: the gateway must not send it through a public
// route. /admin runs the "admin" handler (which a real application would
// only serve to an authenticated user), everything else the "public" one.
//
// usage: node express/upstream.js LOG   (prints "READY <port>"; one JSON
// line per request, as lenient_upstream.js writes them, is appended to LOG)
'use strict';
const fs = require('fs');
const express = require('express');

const META = new Set([
  'script-name', 'path-info', 'remote-user', 'remote-addr', 'auth-type', 'request-uri',
  'server-name', 'x-script-name', 'x-scheme', 'remote-groups', 'x-remote-user',
  'x-remote-addr', 'x-originating-ip', 'x-envoy-original-path', 'x-original-method',
  'x-webauth-user', 'x-ssl-client-cert',
]);

const log = process.argv[2];

function answer(handler) {
  return (req, res) => {
    const identity = {};
    const forwarding = {};
    const meta = {};
    for (const [k, v] of Object.entries(req.headers)) {
      const name = k.replace(/[^a-z0-9]/g, '-');
      if (name.startsWith('x-auth-')) {
        identity[name] = String(v);
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
        stack: 'express', handler, method: req.method, path: req.originalUrl, identity, forwarding, meta, body,
      });
      fs.appendFileSync(log, line + '\n');
      res.type('application/json').send(line);
    });
  };
}

const app = express();
app.use('/admin', answer('admin'));
app.use(answer('public'));
const server = app.listen(0, '127.0.0.1', () => {
  console.log(`READY ${server.address().port}`);
});
