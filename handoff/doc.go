// Package handoff owns every file descriptor that crosses a process boundary:
// the listener Registry (sockets opened by the agent or inherited from
// systemd or a previous agent through tableflip, leased by the specs that
// use them and closed with the last lease), the sockets handed to workers
// with the systemd LISTEN_FDS protocol and the environment they start with,
// the sd_notify readiness socket and the node-ipc channel. It knows nothing
// about apps or releases.
//
// A socket's file-status flags (O_NONBLOCK) live in the open file description
// that every process holding the socket shares. The package never calls
// (*os.File).Fd on a socket, because Fd switches the shared description to
// blocking mode for every holder (golang/go#43894); it reads descriptors
// through SyscallConn instead and starts processes with syscall.ForkExec.
package handoff
