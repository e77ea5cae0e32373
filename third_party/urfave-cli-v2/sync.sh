#!/bin/bash
# deployd's fork of github.com/urfave/cli/v2 (DEPLOYD.md).
#
#   ./sync.sh           check: every upstream file of the version deployd's go.mod
#                       requires is here unchanged, except help.go, which differs from
#                       upstream's by deployd.patch exactly; then run the fork's tests
#   ./sync.sh --update  after `go get github.com/urfave/cli/v2@NEW` in deployd: copy
#                       that version's files here and apply deployd.patch to help.go
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
version=$(go list -m -f '{{.Version}}' github.com/urfave/cli/v2)
# Downloaded (and checked against the checksum database) from a scratch module,
# so that deployd's go.sum, which holds no line for the replaced module, stays as it is.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && go mod init sync >/dev/null 2>&1 && go mod download -json "github.com/urfave/cli/v2@$version") >"$tmp/dl.json"
upstream=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$tmp/dl.json")
[ -d "$upstream" ] || { echo "sync.sh: no module folder for urfave/cli/v2 $version" >&2; exit 1; }
# The upstream package's files: its Go sources without tests, go.mod, go.sum, LICENSE.
files=$(cd "$upstream" && ls *.go go.mod go.sum LICENSE | grep -v '_test\.go$' | tr '\n' ' ')
ours="DEPLOYD.md deployd.patch sync.sh help_render.go help_render_test.go"

if [ "${1:-}" = "--update" ]; then
	for f in $files; do install -m 0644 "$upstream/$f" "$here/$f"; done
	patch --no-backup-if-mismatch -s "$here/help.go" "$here/deployd.patch"
	echo "sync.sh: urfave/cli/v2 $version copied and patched; now run ./sync.sh"
	exit 0
fi

fail=0
for f in $files; do
	[ "$f" = help.go ] && continue
	if ! cmp -s "$upstream/$f" "$here/$f"; then
		echo "sync.sh: $f differs from urfave/cli/v2 $version (run ./sync.sh --update)" >&2
		fail=1
	fi
done
for f in $(cd "$here" && ls); do
	case " $files $ours " in *" $f "*) ;; *)
		echo "sync.sh: $f is neither upstream's nor listed as deployd's" >&2
		fail=1
	esac
done
if ! cmp -s <(diff -u --label upstream/help.go --label help.go "$upstream/help.go" "$here/help.go" || true) "$here/deployd.patch"; then
	echo "sync.sh: help.go differs from upstream's by more or less than deployd.patch" >&2
	fail=1
fi
[ $fail = 0 ] || exit 1
(cd "$here" && go vet . && go test -count=1 .)
echo "sync.sh: the fork is urfave/cli/v2 $version + deployd.patch + help_render.go; its tests pass"
