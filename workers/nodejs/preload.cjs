// deployd's Node.js preload. The agent embeds this file, writes it under its
// state_dir and starts node with NODE_OPTIONS="--require <it>" when an app's
// command runs node. Without the DEPLOYD_NODE variable it does nothing, so
// it is inert in every process of the chain that is not the app (npm's own
// node, a child the app spawns after it took the listeners).
//
// What it does in the app's process, before the app's code runs:
// - sets LISTEN_PID to its pid when the agent started node without its exec
//   shim (cfg.listenPid);
// - maps the app's own listen(port) (every form net.Server.listen takes) onto
//   the inherited socket of the configured listener with that port (unix
//   sockets by path); a port the config does not list is a clear error and
//   exit 1;
// - serves deployd's private health listener (cfg.healthFd, with ready =
//   "http:PATH" or a [health] table) with the request handler of the app's
//   first plain HTTP server (not HTTPS: the agent probes in plain HTTP),
//   once that server listens on a configured listener;
// - reports on its control channel (sd_notify lines on a unix stream socket
//   at a high fd, which reaches node through npm and sh): READY=1 once every
//   configured listener is served (only with ready = "notify"), STATUS=...;
// - drains on the stop signal: stop accepting (close the listening handle
//   only), answer every later request with "Connection: close", close a
//   keep-alive connection only after it served and then stayed idle for a
//   grace (a request the client sends at that moment is the only one at
//   risk, and clients retry a request a closed idle connection never
//   answered), exit when the last connection is gone or near stop_timeout.
//   An app's own stop handler (server.close, process.exit) is honoured:
//   server.close closes only the listening handle, process.exit waits for
//   the drain.
//
// Written in conservative syntax so that an old node reaches the version
// check instead of a syntax error.
'use strict';

(function deploydPreload() {
  var raw = process.env.DEPLOYD_NODE;
  if (!raw) return;
  var major = parseInt(String(process.versions.node).split('.')[0], 10);
  if (!(major >= 18)) {
    process.stderr.write('deployd: node ' + process.version + ' is too old for deployd\'s Node.js integration, ' +
      'which needs node 18 or newer: install node 18+ (https://nodejs.org), or set node = "off" in this app\'s ' +
      'table in deployd.toml and pass the listeners yourself (listen({fd: 3}))\n');
    process.exit(1);
  }
  var cfg;
  try {
    cfg = JSON.parse(raw);
  } catch (e) {
    process.stderr.write('deployd: DEPLOYD_NODE is not valid JSON (' + e.message + '); the preload is off\n');
    return;
  }
  run(cfg);
})();

function run(cfg) {
  // Started without deployd's exec shim (a node command run directly), this
  // process is the one the listeners are for: LISTEN_PID is its pid, as the
  // socket-activation protocol wants, before the app's code reads it. A
  // child process inherits it, and so sees a pid not its own.
  if (cfg.listenPid && process.env.LISTEN_FDS !== undefined && !process.env.LISTEN_PID) {
    process.env.LISTEN_PID = String(process.pid);
  }
  var net = require('net');
  var http = require('http');
  var path = require('path');

  var IDLE_GRACE_MS = 1000; // a keep-alive connection idle this long after a response is closed
  var FRESH_GRACE_MS = 5000; // an accepted connection that never sent a request
  var listeners = cfg.listeners || [];
  var served = listeners.map(function () { return false; });
  var stopSignal = cfg.stopSignal || 'SIGTERM';
  var stopTimeout = cfg.stopTimeoutMs > 0 ? cfg.stopTimeoutMs : 30000;
  var kState = Symbol('deployd');

  var origListen = net.Server.prototype.listen;
  var origNetClose = net.Server.prototype.close;
  var origHttpClose = http.Server.prototype.close;
  var origExit = process.exit;

  var ctl = null;
  var installed = false;
  var readySent = false;
  var stopping = false;
  var drained = false;
  var appOwnsExit = false;
  var pendingExit = null;
  var mapped = []; // servers listening on a configured listener
  var healthFd = typeof cfg.healthFd === 'number' && cfg.healthFd > 0 ? cfg.healthFd : -1;
  var healthServer = null; // accepts on healthFd, hands each connection to the app's server

  function send(lines, cb) {
    if (typeof cfg.ctl !== 'number' || cfg.ctl < 0) {
      if (cb) cb();
      return;
    }
    try {
      if (!ctl) {
        ctl = new net.Socket({ fd: cfg.ctl, readable: false, writable: true });
        ctl.on('error', function () {});
        ctl.unref();
      }
      ctl.write(lines.join('\n') + '\n', cb);
    } catch (e) {
      if (cb) cb();
    }
  }

  function portOf(v) {
    if (typeof v === 'number' && Number.isInteger(v)) return v;
    if (typeof v === 'string' && /^[0-9]+$/.test(v)) return Number(v);
    return null;
  }

  // parse reads net.Server.listen's arguments: {kind: 'tcp', port, host} or
  // {kind: 'unix', path}, or {kind: 'other'} for a listen left as it is (an
  // fd or handle of the app's own, port 0 or none: an ephemeral port).
  function parse(args) {
    var a = Array.prototype.slice.call(args);
    var cb = typeof a[a.length - 1] === 'function' ? a.pop() : null;
    var first = a[0];
    var r = { kind: 'other', cb: cb };
    if (first !== null && typeof first === 'object') {
      if (first._handle || first.handle || typeof first.fd === 'number') return r;
      if (typeof first.path === 'string') {
        r.kind = 'unix';
        r.path = first.path;
      } else {
        r.port = portOf(first.port);
        r.host = first.host;
        if (r.port) r.kind = 'tcp';
      }
      r.backlog = first.backlog;
      return r;
    }
    var port = portOf(first);
    if (port) {
      r.kind = 'tcp';
      r.port = port;
      r.host = typeof a[1] === 'string' ? a[1] : undefined;
      r.backlog = typeof a[1] === 'number' ? a[1] : a[2];
    } else if (typeof first === 'string' && port === null) {
      r.kind = 'unix';
      r.path = first;
      r.backlog = a[1];
    }
    return r;
  }

  // find is the index of the configured listener for r: -1 if the config
  // has none, -2 if every one is served already by this process.
  function find(r) {
    var any = false;
    var best = -1;
    for (var i = 0; i < listeners.length; i++) {
      var l = listeners[i];
      var ok = r.kind === 'unix' ? l.path && path.resolve(r.path) === l.path : !l.path && l.port === r.port;
      if (!ok) continue;
      any = true;
      if (served[i]) continue;
      if (best < 0 || (r.host && l.host === r.host)) best = i;
    }
    return best >= 0 ? best : any ? -2 : -1;
  }

  function describe(l) {
    return l.path ? 'unix:' + l.path : l.network + '://' + l.address;
  }

  function unlisted(r) {
    var what = r.kind === 'unix' ? 'unix socket ' + r.path : 'port ' + r.port;
    var add = r.kind === 'unix' ? 'unix://' + path.resolve(r.path) : 'tcp://0.0.0.0:' + r.port;
    var have = listeners.length ? listeners.map(describe).join(', ') : 'none';
    var msg = 'deployd: the app listens on ' + what + ', which is not in the listen list of app "' + cfg.app +
      '" (configured: ' + have + '); add it in [apps.' + cfg.app + '] of deployd.toml, e.g. listen = ["' + add + '"]';
    fail(msg);
  }

  function fail(msg) {
    process.stderr.write(msg + '\n');
    process.exitCode = 1;
    var t = setTimeout(function () { origExit.call(process, 1); }, 500);
    send(['ERROR=' + msg], function () {
      clearTimeout(t);
      origExit.call(process, 1);
    });
  }

  function checkReady() {
    var missing = [];
    for (var i = 0; i < listeners.length; i++) if (!served[i]) missing.push(describe(listeners[i]));
    if (missing.length) {
      send(['STATUS=serving ' + (listeners.length - missing.length) + ' of ' + listeners.length +
        ' listeners; waiting for a listen on ' + missing.join(', ')]);
      return;
    }
    var lines = ['STATUS=serving ' + listeners.map(describe).join(', ')];
    if (cfg.ready && !readySent) {
      readySent = true;
      lines.push('READY=1');
    }
    send(lines);
  }

  // ready = "node-ipc" through npm start: npm's own node took the channel, so
  // the app's process.send('ready') reaches the agent on the preload's one.
  if (cfg.nodeIPC && typeof process.send !== 'function') {
    process.send = function (msg) {
      var cb = arguments[arguments.length - 1];
      if (msg === 'ready') send(['NODE_IPC=ready']);
      if (typeof cb === 'function') process.nextTick(cb, null);
      return true;
    };
  }

  // An app with no listener (a queue worker) is ready once its main module
  // has run.
  if (listeners.length === 0 && cfg.ready) {
    setImmediate(function () { send(['READY=1', 'STATUS=running (no listeners configured)']); });
  }

  net.Server.prototype.listen = function () {
    var r = parse(arguments);
    if (r.kind === 'other') return origListen.apply(this, arguments);
    var i = find(r);
    if (i === -1) {
      unlisted(r);
      return this;
    }
    if (i === -2) {
      var self = this;
      var what = r.kind === 'unix' ? r.path : 'port ' + r.port;
      var closed = listeners.some(function (l, j) { return served[j] === 'closed' && (l.path ? l.path === path.resolve(String(r.path)) : l.port === r.port); });
      var err = new Error(closed
        ? 'listen EADDRINUSE: deployd: this process closed its listener of ' + what + ' and cannot listen on it again ' +
          '(its inherited socket went with it); exit instead, and deployd starts a new worker'
        : 'listen EADDRINUSE: address already in use: this process serves ' + what + ' already');
      err.code = 'EADDRINUSE';
      process.nextTick(function () { self.emit('error', err); });
      return this;
    }
    var l = listeners[i];
    var server = this;
    install();
    track(server);
    served[i] = 'pending';
    server.once('listening', function () {
      served[i] = true;
      if (l.path) server._pipeName = l.path;
      serveHealth(server);
      checkReady();
      // Closing the handle closed the inherited fd: this process cannot serve it again.
      server.once('close', function () { served[i] = 'closed'; });
    });
    server.once('error', function (err) {
      if (served[i] === 'pending') served[i] = false;
      send(['STATUS=listen on ' + describe(l) + ' failed: ' + (err && err.message)]);
    });
    var opts = { fd: l.fd };
    if (typeof r.backlog === 'number') opts.backlog = r.backlog;
    return r.cb ? origListen.call(this, opts, r.cb) : origListen.call(this, opts);
  };

  // serveHealth makes the health listener feed server (the app's first plain
  // HTTP server to listen) with its connections, so the app's own handler
  // answers the agent's health checks. The listener does not keep the
  // process alive, and closes when the drain begins.
  function serveHealth(server) {
    if (healthFd < 0 || healthServer || !(server instanceof http.Server)) return;
    healthServer = net.createServer(function (sock) { server.emit('connection', sock); });
    healthServer.on('error', function (err) {
      send(['STATUS=health listener (fd ' + healthFd + ') failed: ' + (err && err.message)]);
    });
    origListen.call(healthServer, { fd: healthFd });
    healthServer.unref();
  }

  // install sets up the stop path once this process serves a listener: a
  // process that never listens (npm's own node) keeps node's defaults.
  function install() {
    if (installed) return;
    installed = true;
    // A child process of the app must not take the app's listeners.
    delete process.env.DEPLOYD_NODE;
    process.prependListener(stopSignal, onStop);
    process.exit = function (code) {
      if (stopping && !drained) {
        pendingExit = code === undefined ? (typeof process.exitCode === 'number' ? process.exitCode : 0) : code;
        process.exitCode = pendingExit;
        return undefined;
      }
      return origExit.apply(process, arguments);
    };
    net.Server.prototype.close = function (cb) {
      return this[kState] ? closeMapped(this, cb) : origNetClose.apply(this, arguments);
    };
    http.Server.prototype.close = function (cb) {
      return this[kState] ? closeMapped(this, cb) : origHttpClose.apply(this, arguments);
    };
  }

  // tlsServer tells whether server is a tls.Server (https.Server is one)
  // without loading tls, which costs every worker's start several ms of
  // CPU: only an app that made a TLS server has it loaded. For the first
  // one, https's own close (which would cut idle connections) is patched
  // as http's is.
  var httpsPatched = false;
  function tlsServer(server) {
    if (typeof server.setSecureContext !== 'function' || !(server instanceof require('tls').Server)) return false;
    if (!httpsPatched) {
      httpsPatched = true;
      var https = require('https');
      var origHttpsClose = https.Server.prototype.close;
      https.Server.prototype.close = function (cb) {
        return this[kState] ? closeMapped(this, cb) : origHttpsClose.apply(this, arguments);
      };
    }
    return true;
  }

  function track(server) {
    if (server[kState]) return;
    var st = { conns: new Map(), draining: false, closed: false };
    server[kState] = st;
    mapped.push(server);
    server.once('close', function () { st.closed = true; });
    var event = tlsServer(server) ? 'secureConnection' : 'connection';
    server.on(event, function (sock) {
      var c = { inflight: 0, served: 0, idleSince: Date.now(), timer: null, res: null };
      st.conns.set(sock, c);
      sock.once('close', function () {
        if (c.timer) clearTimeout(c.timer);
        st.conns.delete(sock);
        checkDone();
      });
      if (st.draining) scheduleIdle(sock, c);
    });
    server.prependListener('request', function (req, res) {
      var sock = req.socket;
      var c = st.conns.get(sock);
      if (c) {
        c.inflight++;
        if (c.timer) {
          clearTimeout(c.timer);
          c.timer = null;
        }
      }
      if (st.draining && !res.headersSent) res.setHeader('Connection', 'close');
      if (c) c.res = res;
      res.once('close', function () {
        if (!c) return;
        if (c.res === res) c.res = null;
        c.inflight--;
        c.served++;
        c.idleSince = Date.now();
        if (st.draining) scheduleIdle(sock, c);
      });
    });
  }

  // scheduleIdle closes sock once it has been idle for its grace. A response
  // sent with "Connection: close" closes its connection by itself.
  function scheduleIdle(sock, c) {
    if (c.inflight > 0 || c.timer || sock.destroyed) return;
    var grace = c.served > 0 ? IDLE_GRACE_MS : FRESH_GRACE_MS;
    c.timer = setTimeout(function () {
      c.timer = null;
      if (c.inflight > 0 || sock.destroyed) return;
      if (Date.now() - c.idleSince >= grace) sock.end();
      else scheduleIdle(sock, c);
    }, Math.max(0, c.idleSince + grace - Date.now()));
  }

  function drainServer(server) {
    var st = server[kState];
    if (st.draining) return;
    st.draining = true;
    if (server.listening) origNetClose.call(server);
    st.conns.forEach(function (c, sock) {
      // A response in flight whose headers are not out yet closes its connection too.
      if (c.res && !c.res.headersSent) c.res.setHeader('Connection', 'close');
      scheduleIdle(sock, c);
    });
  }

  // closeMapped is server.close of a mapped server: only the listening
  // handle closes (node 19+'s http close would also cut idle connections,
  // including accepted ones whose request is on its way); cb runs once the
  // last connection is gone, without the error of a second close.
  function closeMapped(server, cb) {
    var st = server[kState];
    drainServer(server);
    if (typeof cb === 'function') {
      if (st.closed) process.nextTick(cb);
      else server.once('close', function () { cb(); });
    }
    return server;
  }

  function onStop() {
    if (stopping) return;
    stopping = true;
    appOwnsExit = process.listenerCount(stopSignal) > 1;
    var n = 0;
    mapped.forEach(function (s) { n += s[kState].conns.size; });
    process.stderr.write('deployd: ' + stopSignal + ': draining ' + n + ' connections (pid ' + process.pid + ')\n');
    send(['STOPPING=1', 'STATUS=draining']);
    if (healthServer && healthServer.listening) origNetClose.call(healthServer);
    mapped.forEach(drainServer);
    var t = setTimeout(function () {
      var left = 0;
      mapped.forEach(function (s) { left += s[kState].conns.size; });
      process.stderr.write('deployd: drain not done near stop_timeout: ' + left + ' connections left; exiting\n');
      drained = true;
      origExit.call(process, pendingExit !== null ? pendingExit : 1);
    }, Math.max(stopTimeout - 1000, stopTimeout * 0.9));
    t.unref();
    checkDone();
  }

  function checkDone() {
    if (!stopping || drained) return;
    for (var i = 0; i < mapped.length; i++) if (mapped[i][kState].conns.size > 0) return;
    drained = true;
    if (pendingExit !== null) {
      origExit.call(process, pendingExit);
    } else if (!appOwnsExit) {
      origExit.call(process, typeof process.exitCode === 'number' ? process.exitCode : 0);
    }
    // else: the app's own handler decides (its server.close callback runs now).
  }
}
