// deployd's Bun preload. The agent embeds this file, writes it under its
// state_dir and starts bun with BUN_OPTIONS="--preload <it>" when an app's
// command runs bun. Without the DEPLOYD_BUN variable it does nothing, so it
// is inert in every bun process of the chain that is not the app.
//
// It drains every Bun.serve server on the stop signal, as deployd's Node.js
// preload drains node's: every response from then on says
// "Connection: close" (Bun closes the connection once it is written), the
// server keeps serving the connections it has for a short close window so
// that each kept-alive client's next request is answered rather than cut,
// then server.stop() stops accepting (Bun lets in-flight requests finish,
// then closes what is idle), and the process exits once no request is in
// flight, or a little before stop_timeout. An app with its own handler
// for the signal exits when it decides (its cleanup may take longer).
(function deploydBunPreload() {
  var raw = process.env.DEPLOYD_BUN;
  if (!raw || typeof Bun === 'undefined') return;
  var cfg = {};
  try { cfg = JSON.parse(raw); } catch (e) {
    process.stderr.write('deployd: DEPLOYD_BUN is not valid JSON (' + e.message + '); the drain is off\n');
    return;
  }
  delete process.env.DEPLOYD_BUN; // not for the app's children
  var stopTimeout = cfg.stopTimeoutMs > 0 ? cfg.stopTimeoutMs : 30000;
  var closeWindow = Math.min(cfg.closeWindowMs > 0 ? cfg.closeWindowMs : 1000, stopTimeout / 4);
  var signal = cfg.stopSignal || 'SIGTERM';
  var servers = [];
  var inFlight = 0;
  var draining = false;
  var stopped = false;

  function closing(res) {
    return draining ? deploydWithClose(res) : res;
  }

  function wrap(handler) {
    if (typeof handler !== 'function') return handler;
    return function deploydFetch(req, server) {
      inFlight++;
      var done = function () { inFlight--; maybeExit(); };
      var out;
      try {
        out = handler.apply(this, arguments);
      } catch (e) { done(); throw e; }
      if (out && typeof out.then === 'function') {
        return out.then(function (r) { done(); return closing(r); }, function (e) { done(); throw e; });
      }
      done();
      return closing(out);
    };
  }

  function wrapRoutes(routes) {
    if (!routes || typeof routes !== 'object') return routes;
    var out = {};
    Object.keys(routes).forEach(function (k) {
      var v = routes[k];
      if (typeof v === 'function') out[k] = wrap(v);
      else if (v && typeof v === 'object' && !(v instanceof Response) && !(v instanceof Blob)) {
        var m = {};
        Object.keys(v).forEach(function (meth) { m[meth] = wrap(v[meth]); });
        out[k] = m;
      } else out[k] = v; // a static response: Bun answers it without JS
    });
    return out;
  }

  function wrapOptions(o) {
    if (!o || typeof o !== 'object') return o;
    var c = Object.assign({}, o);
    if (c.fetch) c.fetch = wrap(c.fetch);
    if (c.routes) c.routes = wrapRoutes(c.routes);
    return c;
  }

  var serve = Bun.serve;
  Bun.serve = function deploydServe(options) {
    var s = serve.call(Bun, wrapOptions(options));
    var reload = s.reload;
    if (typeof reload === 'function') {
      s.reload = function (o) { return reload.call(s, wrapOptions(o)); };
    }
    servers.push(s);
    if (draining) setTimeout(function () { stopAll(); }, 0);
    return s;
  };

  function pending() {
    var n = inFlight;
    servers.forEach(function (s) { n = Math.max(n, s.pendingRequests || 0); });
    return n;
  }

  function stopAll() {
    stopped = true;
    servers.forEach(function (s) { try { s.stop(false); } catch (e) { /* stopped already */ } });
    maybeExit();
  }

  // appExits: the app has a handler of its own for the signal; it decides
  // when to exit (its cleanup may outlast the drain), the drain only
  // answers with Connection: close and stops the servers.
  var appExits = false;

  function maybeExit() {
    if (stopped && !appExits && pending() === 0) {
      // One more turn: Bun writes the last response before the exit.
      setTimeout(function () { if (pending() === 0) process.exit(0); }, 20);
    }
  }

  process.on(signal, function () {
    if (draining) return;
    draining = true;
    appExits = process.listenerCount(signal) > 1;
    setTimeout(stopAll, closeWindow);
    if (!appExits) {
      setTimeout(function () { process.exit(0); }, Math.max(stopTimeout - 1000, stopTimeout * 0.9)).unref();
    }
  });
})();
