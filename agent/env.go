package agent

import (
	"os"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
)

// appEnv is the environment app's workers and hooks start from: a clean
// one (handoff.CleanEnv) of the agent's environment, with HOME, USER and
// LOGNAME of the app's user when it has one, the variables its env_inherit
// names, and its own env and env_file. The agent's other variables (a
// token in a systemd Environment=, a CI secret) never reach an app.
func appEnv(app *config.App) []string {
	var acct *handoff.Account
	if app.User != "" {
		// A user that cannot be found fails the start in credential.
		if u, err := lookupUser(app.User); err == nil {
			acct = &handoff.Account{Name: u.Username, Home: u.HomeDir}
		}
	}
	return handoff.CleanEnv(os.Environ(), acct, app.EnvInherit, app.Env)
}
