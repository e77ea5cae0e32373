package workers

import (
	"sync"
	"time"
)

// A claim is the caller's operation on the app that spans several calls:
// a deploy runs its before hook, then Reload, then its after hook; a scale
// checks the spec, then calls Scale. The supervisor owns it with the
// operation that runs (state.op), so that the app's busy state has one
// owner: the caller asks Claim before it starts, and a second claim is
// refused at once. The supervisor's own operations (a monitor's
// replacement, a held canary's automatic end) do not wait for a claim; each
// call the claim's holder makes is admitted by begin as before, and is
// refused while one of those runs.

// Claim claims the app for the caller's operation what, or returns a
// *BusyError naming the claim that holds it. release ends the claim (a
// second call does nothing). Once the supervisor has stopped, the claim is not
// recorded (every call fails with ErrCanceled then).
func (s *Supervisor) Claim(what string) (release func(), err error) {
	release, held := s.claim(what)
	if held != nil {
		return nil, held.busy(s.opts.App)
	}
	return release, nil
}

// ClaimWait claims the app for what, waiting for a claim that holds it to
// end; see Claim.
func (s *Supervisor) ClaimWait(what string) (release func()) {
	for {
		release, held := s.claim(what)
		if held == nil {
			return release
		}
		<-held.done
	}
}

// Claimed returns the claim that holds the app, nil when none does.
func (s *Supervisor) Claimed() *BusyError {
	var out *BusyError
	s.read(func(st *state) {
		if st.claim != nil {
			out = st.claim.busy(s.opts.App)
		}
	})
	return out
}

// claim records a claim for what, or returns the one that holds the app.
func (s *Supervisor) claim(what string) (release func(), held *opInfo) {
	info := &opInfo{what: what, since: time.Now(), done: make(chan struct{})}
	if !s.call(func(st *state) {
		if held = st.claim; held == nil {
			st.claim = info
		}
	}) {
		return func() {}, nil
	}
	if held != nil {
		return nil, held
	}
	return sync.OnceFunc(func() {
		s.call(func(st *state) {
			if st.claim == info {
				st.claim = nil
			}
		})
		close(info.done)
	}), nil
}
