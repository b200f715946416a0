// An Express application behind the gateway. Express's router matches
// paths without regard to case by default, so `/ADMIN/users` runs the
// handler mounted at /admin: the gateway must not send it through a public
// route. /admin runs the "admin" handler (which a real application would
// only serve to an authenticated user), everything else the "public" one.
//
// usage: node express/upstream.js LOG   (prints "READY <port>"; one JSON
// line per request, as lenient_upstream.js writes them, is appended to LOG)
'use strict';
const express = require('express');
const { record } = require('../record');

const log = process.argv[2];

function answer(handler) {
  return (req, res) => {
    record(log, req, 'express', handler, req.originalUrl, (line) => {
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
