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
//   exit 1; for an app with no listen list (cfg.learn) the listen binds as
//   asked, the agent's bind trap answers that bind (its address policy
//   decides), and the server is drained once it listens;
// - finds every other server that accepts on an inherited listener however
//   it was bound (listen({fd: N}), listen(handle), a framework's server): by
//   its fd or its address once it listens; one on an address deployd does
//   not manage is left alone (NODE_DEBUG=deployd says so);
// - makes a cluster-module app take its worker branch, as under PM2: the
//   app sees itself as cluster worker DEPLOYD_WORKER+1 (cluster.isPrimary
//   and isMaster false, isWorker true, cluster.worker set), so the agent's
//   `instances` processes serve and none forks children;
// - serves deployd's private health listener (cfg.healthFd, with ready =
//   "http:PATH" or a [health] table) with the request handler of the app's
//   first plain HTTP server (not HTTPS: the agent probes in plain HTTP),
//   once that server listens on a configured listener;
// - reports on its control channel (sd_notify lines on a unix stream socket
//   at a high fd, which reaches node through npm and sh): READY=1 once every
//   configured listener is served (only with ready = "notify"), STATUS=...,
//   LOG=... (what the preload itself did, for the agent's log, not the app's);
// - drains every server on an inherited listener on the stop signal: stop
//   accepting (close the listening handle only), answer every later HTTP/1
//   request with "Connection: close", send an HTTP/2 session its GOAWAY at
//   the next stream it opens (before that stream's response), end
//   long-lived responses (server-sent events, WebSockets with a 1001 close
//   frame) after a short grace so that their clients reconnect to a new
//   worker, and exit when the last connection is gone or near stop_timeout.
//   An idle HTTP/1 connection is left to its client's next request (its
//   answer says "Connection: close"); the drain closes none sooner than
//   the app's keepAliveTimeout would, until its last call a little before
//   stop_timeout (closing it races a request the client may be sending).
//   A connection is closed only once a turn of the event loop that read
//   the network found no byte on it: a request a busy event loop has not
//   read yet waits in the socket, and closing the connection then would
//   lose it (node's own keepAliveTimeout and closeIdleConnections get the
//   same check). An app's own stop handler (server.close, process.exit)
//   is honoured: server.close closes only the listening handle,
//   process.exit waits for the drain.
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

  var IDLE_GRACE_MS = 1000; // after the drain's last call, a connection idle this long is closed
  var FRESH_GRACE_MS = 5000; // a connection of a server that is not HTTP, idle this long
  var QUIET_TURN_MS = 20; // a loop turn this short read every byte that came before it
  var listeners = cfg.listeners || [];
  var served = listeners.map(function () { return false; });
  var stopSignal = cfg.stopSignal || 'SIGTERM';
  var stopTimeout = cfg.stopTimeoutMs > 0 ? cfg.stopTimeoutMs : 30000;
  // Long-lived responses (event streams, WebSockets) end this long after
  // the stop signal: their clients reconnect, to a new worker.
  var STREAM_GRACE_MS = Math.min(1000, stopTimeout / 10);
  // A drain's last call, this long after it began: the HTTP/1 connections
  // still idle then are closed (before it, only the app's keepAliveTimeout
  // closes one). A second before the exit near stop_timeout.
  var LAST_CALL_MS = Math.max(stopTimeout - 2000, stopTimeout * 0.8);
  var kState = Symbol('deployd');
  var slot = parseInt(process.env.DEPLOYD_WORKER, 10);

  var origListen = net.Server.prototype.listen;
  var origNetClose = net.Server.prototype.close;
  var origHttpClose = http.Server.prototype.close;
  var origCloseIdle = http.Server.prototype.closeIdleConnections;
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
  var debugLog = null;

  function debug(msg) {
    if (!debugLog) debugLog = require('util').debuglog('deployd');
    debugLog(msg);
  }

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

  // note tells the agent what the preload itself did (a drain begun, a
  // drain cut short): the agent logs it under the worker, so that the app's
  // own log holds only the app's lines. Without the agent's channel it goes
  // to stderr.
  function note(msg) {
    if (typeof cfg.ctl !== 'number' || cfg.ctl < 0) {
      process.stderr.write('deployd: ' + msg + '\n');
      return;
    }
    send(['LOG=' + msg]);
  }

  function portOf(v) {
    if (typeof v === 'number' && Number.isInteger(v)) return v;
    if (typeof v === 'string' && /^[0-9]+$/.test(v)) return Number(v);
    return null;
  }

  // parse reads net.Server.listen's arguments: {kind: 'tcp', port, host} or
  // {kind: 'unix', path}, or {kind: 'other'} for a listen made as it is (an
  // fd or a handle, which adopt recognizes once it listens; port 0 or none:
  // an ephemeral port).
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
      if (l.learned) continue; // a listen of its port binds again: the agent answers it
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

  // learn serves a listen(port) of an app without a listen list
  // (cfg.learn): the app's own bind runs, and the agent's bind trap answers
  // it with the socket its address policy allows, or refuses it (the
  // listen then fails with EACCES or EADDRINUSE as any refused bind, and
  // the agent's log and status say why and what to do). Once the server
  // listens it is drained as one on a configured listener, and the
  // worker is ready. No 'error' listener is added: an app that does not
  // handle a failed listen fails as it would without deployd.
  function learn(server, r) {
    server.prependOnceListener('listening', function () {
      if (server[kState]) return;
      var l = { fd: -1, network: 'tcp', port: r.port, host: r.host, address: hostOf(r.host) + ':' + r.port, learned: true };
      var i = listeners.push(l) - 1;
      served.push(true);
      install();
      track(server, l);
      serveHealth(server);
      checkReady();
      server.once('close', function () { served[i] = 'closed'; });
    });
  }

  // hostOf is the host of a listen(port, host) as a listen address: an IP
  // literal as it is, localhost as 127.0.0.1, none (or another name) as
  // every IPv4 address, which is what the error for an unlisted port
  // suggests too.
  function hostOf(h) {
    if (typeof h !== 'string' || h === '' || h === '::' || h === '0.0.0.0') return '0.0.0.0';
    if (h === 'localhost') return '127.0.0.1';
    if (net.isIPv4(h)) return h;
    if (net.isIPv6(h)) return '[' + h + ']';
    return '0.0.0.0';
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
    for (var i = 0; i < listeners.length; i++) if (served[i] !== true) missing.push(describe(listeners[i]));
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
  // has run. One whose address is learned from its bind (cfg.learn) is
  // ready once it listens (learn).
  if (listeners.length === 0 && cfg.ready && !cfg.learn) {
    setImmediate(function () { send(['READY=1', 'STATUS=running (no listeners configured)']); });
  }

  watchCluster();

  net.Server.prototype.listen = function () {
    var r = parse(arguments);
    // A unix socket the config does not name is the app's own (tsx's IPC
    // pipe in its parent process, an admin socket): the app binds it
    // itself, as its own user, and it is never the port the app serves.
    if (r.kind === 'other' || (r.kind === 'unix' && find(r) === -1)) {
      if (r.kind === 'unix' && cfg.learn) {
        send(['STATUS=left listen(' + path.resolve(r.path) + ') to the app: a unix socket the config does not name is its own; ' +
          'to serve that socket, root adds listen = ["unix://PATH"] (in a folder the app\'s user cannot write)']);
      }
      var srv = this;
      // Before the app's own listening callbacks, which may report readiness.
      srv.prependOnceListener('listening', function () { adopt(srv); });
      return origListen.apply(this, arguments);
    }
    var i = find(r);
    if (i === -1 && cfg.learn && r.kind === 'tcp') {
      learn(this, r);
      return origListen.apply(this, arguments);
    }
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
    track(server, l);
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

  // inherited is the index of the configured listener server accepts on,
  // or -1: by the fd of its listening handle (the agent's copy at l.fd, or
  // fd 3+i of the socket-activation protocol, whose TCP address must match
  // too: through npm and sh the low fds may be other files), else by its
  // address.
  function inherited(server) {
    var h = server._handle;
    var fd = h && typeof h.fd === 'number' ? h.fd : -1;
    var a = null;
    try { a = server.address(); } catch (e) { a = null; }
    var tcp = a !== null && typeof a === 'object';
    var i;
    for (i = 0; i < listeners.length; i++) {
      var l = listeners[i];
      if (fd < 0 || (l.fd !== fd && 3 + i !== fd)) continue;
      if (l.path ? !tcp : tcp && a.port === l.port) return i;
    }
    for (i = 0; i < listeners.length; i++) {
      var m = listeners[i];
      if (m.path ? typeof a === 'string' && path.resolve(a) === m.path : tcp && a.port === m.port && sameHost(m.host, a.address)) return i;
    }
    return -1;
  }

  function sameHost(want, got) {
    if (!want || want === got) return true;
    var any = { '0.0.0.0': true, '::': true, '': true };
    if (any[want] && any[got]) return true;
    return String(got).replace(/^::ffff:/, '') === want;
  }

  // adopt tracks a server the app bound itself (an fd, a handle) once it
  // listens, when it accepts on an inherited listener.
  function adopt(server) {
    if (server[kState]) return;
    var i = inherited(server);
    if (i < 0) {
      var a = null;
      try { a = server.address(); } catch (e) { a = null; }
      debug('server ' + (server.constructor && server.constructor.name) + ' on ' + JSON.stringify(a) +
        ' is not on a listener of app "' + cfg.app + '": left alone (no drain)');
      return;
    }
    var l = listeners[i];
    install();
    track(server, l);
    served[i] = true;
    serveHealth(server);
    checkReady();
    server.once('close', function () { served[i] = 'closed'; });
  }

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
    http.Server.prototype.closeIdleConnections = function () {
      return this[kState] ? closeIdle(this) : origCloseIdle.apply(this, arguments);
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
      var origHttpsCloseIdle = https.Server.prototype.closeIdleConnections;
      https.Server.prototype.closeIdleConnections = function () {
        return this[kState] ? closeIdle(this) : origHttpsCloseIdle.apply(this, arguments);
      };
    }
    return true;
  }

  // kindOf: 'http' (http, https: node's HTTP/1 server), 'h2' (http2's
  // servers, plain and secure, whose HTTP/1 fallback is 'http' too) or
  // 'net' (a plain net or tls server: its protocol is the app's).
  function kindOf(server) {
    for (var p = Object.getPrototypeOf(server); p; p = Object.getPrototypeOf(p)) {
      var n = p.constructor && p.constructor.name;
      if (n === 'Http2Server' || n === 'Http2SecureServer') return 'h2';
    }
    return typeof server.keepAliveTimeout === 'number' && typeof server.headersTimeout === 'number' ? 'http' : 'net';
  }

  function track(server, l) {
    if (server[kState]) return;
    var st = { conns: new Map(), pending: new Set(), sessions: new Set(), streams: new Set(), draining: false, closed: false,
      kind: kindOf(server), lastCall: 0 };
    server[kState] = st;
    mapped.push(server);
    server.once('close', function () { st.closed = true; });
    if (st.kind === 'net') {
      process.stderr.write('deployd: warning: a ' + ((server.constructor && server.constructor.name) || 'net.Server') +
        ' that is not an HTTP server accepts on ' + describe(l) + ' of app "' + cfg.app + '": on ' + stopSignal +
        ' deployd stops its accepting, but cannot tell when its connections are idle: it ends each open ' +
        FRESH_GRACE_MS / 1000 + ' s or more once a turn of the event loop reads no byte from it; end them yourself on ' + stopSignal +
        ' (process.on(\'' + stopSignal + '\', ...)), or serve HTTP with http, https or http2\n');
    }
    var tls = tlsServer(server);
    if (tls) {
      // A connection still in its TLS handshake is not in conns yet: the
      // drain waits for it too (a handshake is slow on a busy machine).
      server.on('connection', function (raw) {
        st.pending.add(raw);
        raw.once('close', function () { settled(raw); });
      });
      server.on('tlsClientError', function (err, tsock) { if (tsock) settled(tsock._parentWrap); });
    }
    function settled(raw) {
      if (st.pending.delete(raw)) checkDone();
    }
    server.on(tls ? 'secureConnection' : 'connection', function (sock) {
      if (tls) st.pending.delete(sock._parentWrap);
      var c = { inflight: 0, idleSince: Date.now(), timer: null, res: null, ws: false, checking: false };
      st.conns.set(sock, c);
      sock.once('close', function () {
        if (c.timer) clearTimeout(c.timer);
        st.conns.delete(sock);
        checkDone();
      });
      if (st.draining) scheduleIdle(st, sock, c);
    });
    if (st.kind === 'h2') {
      server.on('session', function (session) {
        st.sessions.add(session);
        session.once('close', function () { st.sessions.delete(session); });
        if (st.draining) goaway(st, session);
      });
    }
    if (st.kind === 'http') {
      // node's keepAliveTimeout fires before a busy loop reads the request
      // waiting in the socket: without a handler of the app's, an idle
      // connection closes only when no byte came (closeIfQuiet).
      server.on('timeout', function onTimeout(sock) {
        if (server.listenerCount('timeout') > 1) return; // the app's handler decides
        var req = sock.parser && sock.parser.incoming;
        var res = sock._httpMessage;
        if ((req && !req.complete && req.listenerCount('timeout') > 0) || (res && res.listenerCount('timeout') > 0)) return;
        var c = st.conns.get(sock);
        if ((req && !req.complete) || res || !c) sock.destroy(); // node's own answer to a stalled request
        else closeIfQuiet(st, sock, c, true);
      });
      // Which upgraded connections are WebSockets (to end them with a close frame).
      var emit = server.emit;
      server.emit = function (ev, req, sock) {
        if (ev === 'upgrade' && sock) {
          var c = st.conns.get(sock);
          if (c) c.ws = req && req.headers && /websocket/i.test(String(req.headers.upgrade));
        }
        return emit.apply(this, arguments);
      };
    }
    server.prependListener('request', function (req, res) {
      if (req.httpVersionMajor === 2) { // http2 compat: no Connection header, GOAWAY drains
        st.streams.add(res);
        res.once('close', function () { st.streams.delete(res); });
        return;
      }
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
        c.idleSince = Date.now();
        if (st.draining) scheduleIdle(st, sock, c);
      });
    });
  }

  // longLived tells a connection the idle close must leave alone: an
  // HTTP/2 session (GOAWAY drains it) or an upgraded HTTP/1 connection
  // (a WebSocket: ended after the stream grace).
  function longLived(st, sock) {
    return st.kind === 'h2' ? !sock.parser : st.kind === 'http' && !sock.parser && !sock.destroyed;
  }

  // scheduleIdle closes sock, of a draining server, once it is idle at
  // idleDue. A response sent with "Connection: close" closes its connection
  // by itself.
  function scheduleIdle(st, sock, c) {
    if (c.inflight > 0 || c.timer || sock.destroyed) return;
    c.timer = setTimeout(function () {
      c.timer = null;
      if (c.inflight > 0 || sock.destroyed) return;
      if (Date.now() >= idleDue(st, c)) closeIfQuiet(st, sock, c, false);
      else scheduleIdle(st, sock, c);
    }, Math.max(0, idleDue(st, c) - Date.now()));
  }

  // idleDue is when the drain closes an idle connection. Closing an idle
  // HTTP/1 connection races its client's next request, which the client
  // may send before it reads the FIN (it is lost, or retried by a client
  // that dares to): no server wins that race, and a client held up for a
  // moment on a busy machine loses it. So the drain closes none sooner than
  // the app itself would (node's keepAliveTimeout, above) before its last
  // call: each client gets its next answer with "Connection: close" and so
  // learns to go elsewhere. A server that is not HTTP keeps its grace.
  function idleDue(st, c) {
    if (st.kind === 'net') return c.idleSince + FRESH_GRACE_MS;
    return Math.max(st.lastCall, c.idleSince + IDLE_GRACE_MS);
  }

  // closeIfQuiet ends sock (destroys it with destroy) only after a turn of
  // the event loop that read the network found no byte on it. It runs from
  // the timers phase: the poll phase that follows reads what the kernel
  // holds (a request a busy loop left unread), and the check phase after
  // it looks. A long turn (the app's CPU-bound handlers) is checked again,
  // since bytes may have come after its poll.
  function closeIfQuiet(st, sock, c, destroy) {
    if (c.checking || sock.destroyed) return;
    c.checking = true;
    var seen = sock.bytesRead;
    setTimeout(function () {
      var t0 = Date.now();
      setImmediate(function () {
        c.checking = false;
        if (sock.destroyed || c.inflight > 0) return;
        if (sock.bytesRead !== seen || partial(sock)) {
          c.idleSince = Date.now(); // a request is on its way: it gets Connection: close
          if (st.draining) scheduleIdle(st, sock, c);
          return;
        }
        if (Date.now() - t0 > QUIET_TURN_MS) {
          closeIfQuiet(st, sock, c, destroy);
          return;
        }
        if (destroy) sock.destroy();
        else sock.end();
      });
    }, 0);
  }

  // partial tells a connection whose request's head or body is still coming.
  function partial(sock) {
    var req = sock.parser && sock.parser.incoming;
    return !!req && !req.complete;
  }

  // closeIdle is closeIdleConnections of a tracked server: idle connections
  // close, each once no byte waits in it.
  function closeIdle(server) {
    var st = server[kState];
    st.conns.forEach(function (c, sock) {
      if (c.inflight === 0 && !longLived(st, sock)) closeIfQuiet(st, sock, c, true);
    });
  }

  // goaway closes an HTTP/2 session the way "Connection: close" on the next
  // response closes an HTTP/1 connection: at the next stream the client
  // opens, before its response, the session sends its final GOAWAY (the
  // streams read so far are served, the client opens the next one on a new
  // connection). node has no shutdown notice: after any GOAWAY it ignores
  // new streams, so one sent at an arbitrary moment would make a client
  // retry the streams on their way. A session that opens no stream is
  // closed at the drain's last call (as an idle HTTP/1 connection is, for
  // the same race), once a loop turn read no byte from it.
  var kGoaway = Symbol('deployd.goaway');
  function goaway(st, session) {
    if (session.closed || session.destroyed || session[kGoaway]) return;
    session[kGoaway] = true;
    var t = null;
    function close() {
      clearTimeout(t);
      session.removeListener('stream', close);
      if (!session.closed && !session.destroyed) session.close();
    }
    session.prependListener('stream', close);
    session.once('close', function () { clearTimeout(t); });
    var seen = -1;
    t = setTimeout(function check() {
      if (session.closed || session.destroyed) return;
      var now = 0;
      try { now = session.socket.bytesRead; } catch (e) { now = 0; }
      if (now !== seen) { // bytes came: another look after a turn
        seen = now;
        t = setTimeout(check, QUIET_TURN_MS);
        return;
      }
      close();
    }, Math.max(IDLE_GRACE_MS, st.lastCall - Date.now()));
  }

  // endStreams ends what would keep a connection open for long: event
  // streams (their clients reconnect), over HTTP/2 too, and WebSockets
  // (close frame 1001, going away). An HTTP/1 event stream's connection
  // ends with it (FIN after the last chunk): its client's reconnect, on a
  // kept-alive connection, would otherwise start a stream on this worker.
  function endStreams(server) {
    var st = server[kState];
    st.conns.forEach(function (c, sock) {
      if (c.res && !c.res.writableEnded && eventStream(c.res)) {
        c.res.end();
        sock.end();
      } else if (st.kind === 'http' && !sock.parser && !sock.destroyed) endUpgraded(sock, c);
    });
    st.streams.forEach(function (res) {
      if (!res.writableEnded && eventStream(res)) res.end();
    });
  }

  // eventStream tells a response of content-type text/event-stream (set
  // with setHeader, or with writeHead, whose headers only the sent head has).
  function eventStream(res) {
    var t = typeof res.getHeader === 'function' && res.getHeader('content-type');
    if (!t && typeof res._header === 'string') t = (/\r\ncontent-type:([^\r]*)/i.exec(res._header) || [])[1];
    if (!t && res.stream && res.stream.sentHeaders) t = res.stream.sentHeaders['content-type'];
    return /^\s*text\/event-stream/i.test(String(t || ''));
  }

  // endUpgraded closes a WebSocket with 1001 (going away): through the ws
  // library's own object when it has one (the close handshake), else with a
  // close frame of our own.
  function endUpgraded(sock, c) {
    var syms = Object.getOwnPropertySymbols(sock);
    for (var i = 0; i < syms.length; i++) {
      var w = sock[syms[i]];
      if (syms[i].description === 'websocket' && w && typeof w.close === 'function') {
        if (w.readyState === 1) w.close(1001, 'going away');
        return;
      }
    }
    if (!c.ws || sock.writableEnded) return; // another protocol: the app's to end; or ended already
    var reason = Buffer.from('going away');
    var frame = Buffer.concat([Buffer.from([0x88, 2 + reason.length, 0x03, 0xe9]), reason]);
    sock.end(frame);
  }

  function drainServer(server) {
    var st = server[kState];
    if (st.draining) return;
    st.draining = true;
    st.lastCall = Date.now() + LAST_CALL_MS;
    if (server.listening) origNetClose.call(server);
    st.conns.forEach(function (c, sock) {
      // A response in flight whose headers are not out yet closes its connection too.
      if (c.res && !c.res.headersSent) c.res.setHeader('Connection', 'close');
      if (!longLived(st, sock)) scheduleIdle(st, sock, c);
    });
    st.sessions.forEach(function (session) { goaway(st, session); });
    // Again every grace while connections last: a stream that began after
    // the first pass (a request on a connection accepted before the
    // listener closed) ends too, not at stop_timeout.
    var t = setInterval(function () {
      if (st.conns.size === 0 && st.streams.size === 0) clearInterval(t);
      else endStreams(server);
    }, STREAM_GRACE_MS);
    t.unref();
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
    mapped.forEach(function (s) { n += s[kState].conns.size + s[kState].pending.size; });
    send(['STOPPING=1', 'STATUS=draining', 'LOG=' + stopSignal + ': draining ' + n + ' connections']);
    if (typeof cfg.ctl !== 'number' || cfg.ctl < 0) note(stopSignal + ': draining ' + n + ' connections (pid ' + process.pid + ')');
    if (healthServer && healthServer.listening) origNetClose.call(healthServer);
    mapped.forEach(drainServer);
    var t = setTimeout(function () {
      var left = 0;
      mapped.forEach(function (s) { left += s[kState].conns.size + s[kState].pending.size; });
      note('drain not done near stop_timeout: ' + left + ' connections left; exiting');
      drained = true;
      origExit.call(process, pendingExit !== null ? pendingExit : 1);
    }, Math.max(stopTimeout - 1000, stopTimeout * 0.9));
    t.unref();
    checkDone();
  }

  function checkDone() {
    if (!stopping || drained) return;
    for (var i = 0; i < mapped.length; i++) if (mapped[i][kState].conns.size + mapped[i][kState].pending.size > 0) return;
    drained = true;
    if (pendingExit !== null) {
      origExit.call(process, pendingExit);
    } else if (!appOwnsExit) {
      origExit.call(process, typeof process.exitCode === 'number' ? process.exitCode : 0);
    }
    // else: the app's own handler decides (its server.close callback runs now).
  }

  // watchCluster makes an app that uses the cluster module take its worker
  // branch (`if (cluster.isPrimary) fork() else listen()`), as PM2's cluster
  // mode does: deployd's own workers are the cluster. The module is patched
  // when the app loads it (require; an ES module app's entry loads it at
  // once, as its imports cannot be watched), not before: loading it costs a
  // worker's start tens of ms.
  function watchCluster() {
    var Module = require('module');
    var origLoad = Module._load;
    Module._load = function deploydLoad(request) {
      var m = origLoad.apply(this, arguments);
      if (request === 'cluster' || request === 'node:cluster') {
        workerBranch(m);
        if (Module._load === deploydLoad) Module._load = origLoad;
      }
      return m;
    };
    if (esmEntry(process.argv[1])) workerBranch(require('cluster'));
  }

  // esmEntry says whether node runs main as an ES module: .mjs and .mts
  // always; .js, .ts (run by tsx or type stripping) and a file without an
  // extension when the nearest package.json says "type": "module".
  function esmEntry(main) {
    if (typeof main !== 'string') return false;
    if (/\.m[jt]s$/.test(main)) return true;
    if (!/\.[jt]s$/.test(main) && path.extname(main) !== '') return false;
    var fs = require('fs');
    for (var dir = path.dirname(path.resolve(main)); ; dir = path.dirname(dir)) {
      try {
        return JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).type === 'module';
      } catch (e) {
        if (e.code !== 'ENOENT') return false;
      }
      if (path.dirname(dir) === dir) return false;
    }
  }

  // workerBranch turns the primary's cluster module into a worker's as the
  // app sees it. node's own net and dgram read isPrimary too: they keep
  // seeing a primary (a stack check), so listen binds here instead of
  // asking a primary that does not exist.
  function workerBranch(cluster) {
    if (!cluster || cluster[kState] || cluster.isPrimary !== true) return; // a real cluster worker: as it is
    cluster[kState] = true;
    function fromNode(self) {
      var prep = Error.prepareStackTrace;
      var limit = Error.stackTraceLimit;
      var o = {};
      Error.stackTraceLimit = 1;
      Error.prepareStackTrace = function (_, cs) { return cs; };
      try {
        Error.captureStackTrace(o, self);
        var f = o.stack && o.stack[0] && o.stack[0].getFileName();
        return typeof f === 'string' && f.indexOf('node:') === 0;
      } finally {
        Error.prepareStackTrace = prep;
        Error.stackTraceLimit = limit;
      }
    }
    function isPrimary() { return fromNode(isPrimary); }
    function isMaster() { return fromNode(isMaster); }
    function isWorker() { return !fromNode(isWorker); }
    Object.defineProperty(cluster, 'isPrimary', { configurable: true, enumerable: true, get: isPrimary });
    Object.defineProperty(cluster, 'isMaster', { configurable: true, enumerable: true, get: isMaster });
    Object.defineProperty(cluster, 'isWorker', { configurable: true, enumerable: true, get: isWorker });
    var warned = false;
    function dropped(what) {
      if (warned) return;
      warned = true;
      process.stderr.write('deployd: ' + what + ': this app runs as one of deployd\'s workers, with no cluster ' +
        'primary to receive messages; the message is dropped (this is said once)\n');
    }
    var EventEmitter = require('events');
    var w = new EventEmitter();
    w.id = (slot >= 0 ? slot : 0) + 1;
    w.process = process;
    w.state = 'online';
    w.exitedAfterDisconnect = false;
    w.send = function () {
      dropped('cluster.worker.send');
      var cb = arguments[arguments.length - 1];
      if (typeof cb === 'function') process.nextTick(cb, null);
      return true;
    };
    w.isConnected = function () { return false; };
    w.isDead = function () { return false; };
    w.disconnect = function () { return w; };
    w.kill = w.destroy = function (sig) { process.kill(process.pid, sig || 'SIGTERM'); };
    cluster.worker = w;
    cluster.workers = undefined;
    cluster.fork = function () {
      throw new Error('deployd: cluster.fork() in a deployd worker: deployd runs this app\'s worker branch in ' +
        'each of its own workers; set the number of processes with instances in deployd.toml');
    };
    if (typeof process.send !== 'function') {
      process.send = function (msg) {
        if (msg !== 'ready') dropped('process.send');
        var cb = arguments[arguments.length - 1];
        if (typeof cb === 'function') process.nextTick(cb, null);
        return true;
      };
    }
  }
}
