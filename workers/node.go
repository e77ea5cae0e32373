package workers

import (
	"bufio"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers/nodejs"
)

// nodeStart is what a node worker gets besides a plain one: the preload's
// channel at fd nodejs.FirstFD and a second copy of every listener after it
// (the copies reach node through npm and sh; fds 3.. stay as for any app).
type nodeStart struct {
	ch    *handoff.IPCChannel
	fixed []handoff.FixedFile
	env   []string
}

// prepareNode verifies the preload file (rewriting it if it was changed)
// and builds the channel, fds and env for one start of a node worker.
func prepareNode(spec *Spec, env []string) (*nodeStart, error) {
	if err := spec.Node.Preload.Repair(); err != nil {
		return nil, err
	}
	ch, err := handoff.NewIPCChannel()
	if err != nil {
		return nil, err
	}
	n := &nodeStart{ch: ch}
	n.fixed = append(n.fixed, handoff.FixedFile{At: nodejs.FirstFD, Fd: ch.Child.Fd()})
	for i, l := range spec.Listeners {
		n.fixed = append(n.fixed, handoff.FixedFile{At: nodejs.FirstFD + 1 + i, Fd: l.Fd()})
	}
	n.env = spec.Node.Env(env, nodejs.FirstFD, nodejs.FirstFD+1)
	return n, nil
}

// readNode reads the preload's sd_notify lines until EOF (every process
// holding the channel has exited). READY=1 counts only with ready = "notify";
// ERROR= becomes the worker's status, which status shows.
func (w *Worker) readNode(wg *sync.WaitGroup, f *os.File, ready config.Ready) {
	defer wg.Done()
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), handoff.MaxNotifyMessage)
	for sc.Scan() {
		msg := handoff.ParseNotify(sc.Bytes())
		if ready.Mode != config.ReadyNotify {
			delete(msg, "READY")
		}
		if e, ok := msg["ERROR"]; ok {
			msg["STATUS"] = strings.TrimPrefix(e, "deployd: ")
		}
		w.onNotify(msg)
	}
	_, _ = io.Copy(io.Discard, f)
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
