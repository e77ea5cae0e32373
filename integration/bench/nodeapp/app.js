// The Node.js app of deployd's benchmark (go run ./integration/bench): the same file runs
// as one plain process, under PM2 cluster mode, under deployd and as N bare processes
// sharing one inherited socket.
//
//   GET /     "version=V pid=P slot=S"            (hello)
//   GET /cpu  "version=V pid=P slot=S fib=F"      (fib(CPU_FIB) done naively, ~5 ms)
//
// Environment:
//   LISTEN_FDS        set: serve the listening socket on fd 3 (deployd, the bench launcher;
//                     LISTEN_PID is not checked) — else listen on HOST:PORT (PM2 cluster
//                     mode intercepts that listen and shares its own socket)
//   PORT, HOST        default 8080, 127.0.0.1
//   APP_VERSION       reported in every answer, default v1
//   STARTUP_DELAY_MS  wait this long before listening (an app that is slow to start)
//   CPU_FIB           n of fib(n) in /cpu, default 29
//   DRAIN_TIMEOUT_MS  bound of the drain after SIGINT/SIGTERM, default 20000
//   IDLE_GRACE_MS     how long a keep-alive connection must be idle before the drain closes it, default 1000
//
// Readiness: once listening it prints "listening pid=P" and, when it has an IPC channel,
// calls process.send('ready') (PM2 wait_ready, deployd ready = "node-ipc").
//
// Drain on SIGINT or SIGTERM — one that loses no request:
//  1. stop accepting: the listening handle is closed (net.Server.prototype.close), NOT
//     http.Server.close(): since Node 19 that also closes every idle connection,
//     including ones accepted a moment ago whose request has not arrived yet — their
//     request would be lost;
//  2. every request answered from now on carries "Connection: close";
//  3. a keep-alive connection is closed only once it has been idle for IDLE_GRACE_MS
//     (default 1000; one that has served nothing yet: 5 s, Go's rule): a client reusing
//     it in the meantime gets its answer with "Connection: close", instead of having its
//     request cut off on a connection closed under it (which Go's client retries
//     silently, but a client that does not retry sees as a failure);
//  4. exit when the last connection has closed, or after DRAIN_TIMEOUT_MS.
'use strict';

const http = require('http');
const net = require('net');

const version = process.env.APP_VERSION || 'v1';
const slot = process.env.DEPLOYD_WORKER ?? process.env.NODE_APP_INSTANCE ?? '';
const cpuFib = intEnv('CPU_FIB', 29);
const startupDelay = intEnv('STARTUP_DELAY_MS', 0);
const drainTimeout = intEnv('DRAIN_TIMEOUT_MS', 20000);
const idleGrace = intEnv('IDLE_GRACE_MS', 1000);

function intEnv(name, def) {
  const v = parseInt(process.env[name] || '', 10);
  return Number.isFinite(v) && v >= 0 ? v : def;
}

function fib(n) {
  return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

// conns maps each open socket to {inflight, served, idleSince}.
const conns = new Map();
let draining = false;

const server = http.createServer((req, res) => {
  const st = conns.get(req.socket);
  if (st) st.inflight++;
  res.on('close', () => {
    if (!st) return;
    st.inflight--;
    st.served++;
    st.idleSince = Date.now();
  });
  if (draining) res.setHeader('Connection', 'close');
  const head = `version=${version} pid=${process.pid} slot=${slot}`;
  const path = req.url.split('?')[0];
  if (req.method === 'GET' && path === '/') {
    res.end(head + '\n');
  } else if (req.method === 'GET' && path === '/cpu') {
    res.end(`${head} fib=${fib(cpuFib)}\n`);
  } else {
    res.statusCode = 404;
    res.end('not found\n');
  }
});
server.keepAliveTimeout = 30000;

server.on('connection', (socket) => {
  conns.set(socket, { inflight: 0, served: 0, idleSince: Date.now() });
  socket.on('close', () => {
    conns.delete(socket);
    if (draining) maybeExit();
  });
});

function maybeExit() {
  if (conns.size === 0) {
    console.log(`drained pid=${process.pid}`);
    process.exit(0);
  }
}

// closeIdle ends the connections idle for long enough (see step 3 above).
function closeIdle() {
  const now = Date.now();
  for (const [socket, st] of conns) {
    const grace = st.served > 0 ? idleGrace : 5000;
    if (st.inflight === 0 && now - st.idleSince >= grace) socket.end();
  }
}

function drain(signal) {
  if (draining) return;
  draining = true;
  console.log(`${signal}: draining pid=${process.pid} connections=${conns.size}`);
  // Stop accepting without http.Server.close()'s closeIdleConnections (see above).
  net.Server.prototype.close.call(server);
  setInterval(closeIdle, 20).unref();
  setTimeout(() => {
    console.log(`drain timeout after ${drainTimeout} ms: ${conns.size} connections left`);
    process.exit(1);
  }, drainTimeout).unref();
  maybeExit();
}

process.on('SIGINT', () => drain('SIGINT'));
process.on('SIGTERM', () => drain('SIGTERM'));
// PM2 may ask through IPC (shutdown_with_message); it also sends SIGINT.
process.on('message', (m) => {
  if (m === 'shutdown') drain('shutdown message');
});

function listen() {
  const onListening = () => {
    console.log(`listening pid=${process.pid} slot=${slot} version=${version}`);
    if (typeof process.send === 'function') process.send('ready');
  };
  if (process.env.LISTEN_FDS) {
    server.listen({ fd: 3 }, onListening);
  } else {
    server.listen(intEnv('PORT', 8080), process.env.HOST || '127.0.0.1', onListening);
  }
}

if (startupDelay > 0) {
  setTimeout(listen, startupDelay);
} else {
  listen();
}
