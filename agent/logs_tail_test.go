package agent

import "github.com/deployd/deployd/workers/logs"

// tailFrom is what firstLines does with a log for a follow: it returns the
// last n lines of the log at path, streamed, and the offset where they end
// in the file it read, for TestTailFromWhileWritten.
func tailFrom(path string, n int) ([]string, int64, error) {
	var lines []string
	t, err := logs.StreamLast(path, n, func(l string) error {
		lines = append(lines, l)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	t.Close()
	return lines, t.Offset, nil
}
