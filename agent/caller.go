package agent

import (
	"os"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

// Caller is who asks for an operation, as the control API (agent/control)
// found and authorized it. The zero Caller is a member that passed no file
// and may change any app.
type Caller struct {
	// Owner is root or the agent's own uid: the agent opens a path it is
	// given (an artifact, a new binary, a signature) for owners only.
	Owner bool
	// File returns the file the client passed with the request (an
	// artifact, a new binary); nil when the request can carry none.
	File func() (*os.File, error)
	// MayChange says whether the caller may change app (a member may not
	// change one that runs as root); why words a refusal. Nil lets every
	// change through.
	MayChange func(app *config.App) (ok bool, why string)
}

// mayChange applies c.MayChange to app: a refusal is KindForbidden.
func (c Caller) mayChange(app *config.App) error {
	if c.MayChange == nil {
		return nil
	}
	if ok, why := c.MayChange(app); !ok {
		return failWith(api.KindForbidden, "%s", why)
	}
	return nil
}

// file returns the file the caller passed with the request.
func (c Caller) file() (*os.File, error) {
	if c.File == nil {
		return nil, api.ErrNoFile
	}
	return c.File()
}
