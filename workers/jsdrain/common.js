// deployd's drain preload for Bun and Deno, the part both share (the agent
// writes this part, then the runtime's own, as one file).

// withClose is res saying "Connection: close": the runtime closes the
// connection once it is written.
function deploydWithClose(res) {
  if (!(res instanceof Response)) return res;
  try {
    res.headers.set('Connection', 'close');
    return res;
  } catch (e) { // immutable headers (a fetch() response): a copy
    var h = new Headers(res.headers);
    h.set('Connection', 'close');
    return new Response(res.body, { status: res.status, statusText: res.statusText, headers: h });
  }
}

