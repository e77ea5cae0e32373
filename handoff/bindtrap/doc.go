// Package bindtrap answers a worker's own bind() of its configured address
// with the agent's listening socket, so that unmodified servers that bind
// their own port (Go's ListenAndServe, the JDK's HttpServer, uvicorn --port,
// Bun.serve, Deno.serve) share one port in a pool and a new release binds
// while the old one still serves.
//
// The mechanism is seccomp user notification with SECCOMP_IOCTL_NOTIF_ADDFD
// (Linux >= 5.9). The re-exec shim that starts a worker installs,
// on the thread that then execs the app, a classic BPF filter that turns
// bind(2) into a notification (InstallAndSend), and passes the filter's
// notify fd to the agent over a socketpair before the app runs, so the app
// can never close it first. The agent (Serve) reads each bind's sockaddr
// from the caller's memory, checks the notification is still live, asks a
// Decide callback, and either places its own socket at the caller's fd
// (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD, then an answer of 0: the fd is now
// the agent's listener; the app's listen() on it only changes the backlog) or lets the call run as the app's own (CONTINUE). Children and
// exec'd descendants of the worker inherit the filter and are answered the
// same way.
//
// The worker also keeps the notify fd (at the socketpair's fd number, which
// the shim reuses): a filter whose every notify fd is closed fails trapped
// calls with ENOSYS, so a bind made while no agent runs waits for the next
// agent, which copies the fd out of the worker (pidfd_getfd) and answers.
// A worker using its own copy can only answer its own binds, with its own
// sockets and uid: it gains nothing.
package bindtrap
