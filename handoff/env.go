package handoff

import (
	"slices"
	"strings"
)

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
// own and node's IPC channel. None ever reaches a worker or a hook from
// the agent's environment, even when named.
func agentVar(k string) bool {
	switch k {
	case EnvNotifySocket, EnvNodeChannelFD:
		return true
	}
	return startVar(k) || strings.HasPrefix(k, "LISTEN_") || strings.HasPrefix(k, "DEPLOYD_") ||
		strings.HasPrefix(k, "WATCHDOG_")
}

// DefaultPath is a worker's PATH when the agent has none (systemd's).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passVars are the agent's variables every worker and hook gets as they
// are: what a program needs to find programs, speak the local language
// and tell the time, and systemd's credentials folder (LoadCredential=).
var passVars = []string{"PATH", "LANG", "LANGUAGE", "TZ", "CREDENTIALS_DIRECTORY"}

// accountVars describe the account a process runs as: from the app's user
// when it has one, else the agent's own values.
var accountVars = []string{"HOME", "USER", "LOGNAME", "SHELL"}

// Account is the user a worker or a hook runs as, for its environment.
type Account struct {
	Name, Home string
}

// CleanEnv returns the environment of a worker or a hook, built from env
// (the agent's) and nothing else of it: its PATH (DefaultPath when unset),
// LANG, LANGUAGE, LC_*, TZ and CREDENTIALS_DIRECTORY; HOME, USER, LOGNAME
// and SHELL, or with acct (the app's user) HOME=acct.Home and
// USER=LOGNAME=acct.Name; the variables inherit names (never the agent's
// own: LISTEN_*, NOTIFY_SOCKET, DEPLOYD_*, ...); then app ("K=V", the
// app's own), which win over all of these. Each name appears once.
func CleanEnv(env []string, acct *Account, inherit, app []string) []string {
	out := newEnvSet()
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(passVars, k) || strings.HasPrefix(k, "LC_") ||
			acct == nil && slices.Contains(accountVars, k) {
			out.set(kv)
		}
	}
	if !out.has("PATH") {
		out.set("PATH=" + DefaultPath)
	}
	if acct != nil {
		out.set("HOME=" + acct.Home)
		out.set("USER=" + acct.Name)
		out.set("LOGNAME=" + acct.Name)
	}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); slices.Contains(inherit, k) && !agentVar(k) {
			out.set(kv)
		}
	}
	for _, kv := range app {
		out.set(kv)
	}
	return out.list
}

// envSet is an environment in which each name appears once (a later set
// replaces the value in place): Start passes the list to execve as it is,
// and a duplicate would leave getenv to pick one.
type envSet struct {
	at   map[string]int
	list []string
}

func newEnvSet() *envSet { return &envSet{at: map[string]int{}} }

func (e *envSet) set(kv string) {
	k, _, _ := strings.Cut(kv, "=")
	if i, ok := e.at[k]; ok {
		e.list[i] = kv
		return
	}
	e.at[k] = len(e.list)
	e.list = append(e.list, kv)
}

func (e *envSet) has(k string) bool { _, ok := e.at[k]; return ok }

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
