// deployd's Deno preload. The agent embeds this file, writes it under its
// state_dir and starts `deno run --preload <it> ...` when an app's command
// runs deno. The config comes in DEPLOYD_DENO when the app may read its
// environment (--allow-env); without it the defaults below apply.
//
// It drains every Deno.serve server on the stop signal, as deployd's Node.js
// preload drains node's: every response from then on says
// "Connection: close" (Deno closes the connection once it is written), the
// server keeps serving the connections it has for a short close window so
// that each kept-alive client's next request is answered rather than cut,
// then server.shutdown() stops accepting and lets in-flight requests
// finish, and the process exits when it resolves, or a little before
// stop_timeout. Without it Deno exits on SIGTERM with requests in flight.
(function deploydDenoPreload() {
  if (typeof Deno === 'undefined' || typeof Deno.serve !== 'function') return;
  var cfg = {};
  try {
    var raw = Deno.env.get('DEPLOYD_DENO');
    if (raw) cfg = JSON.parse(raw);
  } catch (e) { /* no --allow-env, or not JSON: the defaults */ }
  var stopTimeout = cfg.stopTimeoutMs > 0 ? cfg.stopTimeoutMs : 30000;
  var closeWindow = Math.min(cfg.closeWindowMs > 0 ? cfg.closeWindowMs : 1000, stopTimeout / 4);
  var signal = cfg.stopSignal || 'SIGTERM';
  var servers = [];
  var draining = false;

  function closing(res) {
    return draining ? deploydWithClose(res) : res;
  }

  function wrap(handler) {
    if (typeof handler !== 'function') return handler;
    // The same arity: Deno.serve passes a handler of no parameters no request.
    var h = handler.length === 0 ? function () { return handler.call(this); }
      : handler.length === 1 ? function (req) { return handler.call(this, req); }
        : function (req, info) { return handler.call(this, req, info); };
    var f = function deploydHandler() {
      var out = h.apply(this, arguments);
      if (out && typeof out.then === 'function') return out.then(closing);
      return closing(out);
    };
    Object.defineProperty(f, 'length', { value: handler.length });
    return f;
  }

  // Deno.serve(handler), (options, handler) and (options with handler).
  var serve = Deno.serve;
  var wrapped = function deploydServe(a, b) {
    var args = Array.prototype.slice.call(arguments);
    if (typeof a === 'function') args[0] = wrap(a);
    else if (typeof b === 'function') args[1] = wrap(b);
    else if (a && typeof a === 'object' && typeof a.handler === 'function') {
      args[0] = Object.assign({}, a, { handler: wrap(a.handler) });
    }
    var s = serve.apply(Deno, args);
    servers.push(s);
    if (draining) s.shutdown();
    return s;
  };
  try {
    Object.defineProperty(Deno, 'serve', { value: wrapped, writable: true, configurable: true });
  } catch (e) {
    console.error('deployd: cannot wrap Deno.serve (' + e + '); the drain is off');
    return;
  }

  function stopAll() {
    Promise.allSettled(servers.map(function (s) { return s.shutdown(); })).then(function () {
      setTimeout(function () { Deno.exit(0); }, 20); // one more turn for the last writes
    });
  }

  Deno.addSignalListener(signal, function () {
    if (draining) return;
    draining = true;
    setTimeout(stopAll, closeWindow);
    var t = setTimeout(function () { Deno.exit(0); }, Math.max(stopTimeout - 1000, stopTimeout * 0.9));
    Deno.unrefTimer(t);
  });
})();
