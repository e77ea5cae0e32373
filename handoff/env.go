package handoff

import "strings"

// startVar reports whether Start sets variable k itself (the socket
// activation variables; a caller's stale value must not win) or whether it
// belongs to tableflip (whose variables all start with TABLEFLIP_), so that a
// worker never takes itself for an agent started by a handoff.
func startVar(k string) bool {
	switch k {
	case EnvListenFDs, EnvListenPID, EnvListenFDNames:
		return true
	}
	return strings.HasPrefix(k, "TABLEFLIP_")
}

// agentVar reports whether variable k belongs to the agent alone: what
// Start sets, systemd's LISTEN_*, notify and watchdog variables, deployd's
// own and node's IPC channel.
func agentVar(k string) bool {
	switch k {
	case EnvNotifySocket, "WATCHDOG_USEC", "WATCHDOG_PID", EnvNodeChannelFD:
		return true
	}
	return startVar(k) || strings.HasPrefix(k, "LISTEN_") || strings.HasPrefix(k, "DEPLOYD_")
}

// WorkerEnv returns env (the agent's environment) without the variables
// that belong to the agent alone: the base of every worker's environment.
func WorkerEnv(env []string) []string { return without(env, agentVar) }

// without returns env without the variables drop names.
func without(env []string, drop func(k string) bool) []string {
	out := make([]string, 0, len(env)+3)
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !drop(k) {
			out = append(out, kv)
		}
	}
	return out
}
